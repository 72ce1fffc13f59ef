"""The grounding (NIH boxes) and progression (CheXTemporal-style pairs) protocols as plug-ins: draws, floors with
known answers, every pair scored (fitted methods out-of-fold over patient-disjoint folds) beside the majority floor,
disease-name grounding prompts, the pointing game's tolerance and flat-map rule as settings, and grounding through
the command line into MLflow."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
import yaml
from mlflow import MlflowClient

import apps.benchmarks.chextemporal as chextemporal
import apps.benchmarks.framework.grounding as grounding
from apps.benchmarks import cli
from apps.benchmarks.chextemporal import ChexTemporalProtocol
from apps.benchmarks.chextemporal.progression import out_of_fold
from apps.benchmarks.framework.catalog import CONFIG_DIR, load_protocol
from apps.benchmarks.framework.grounding import hit_region, score_heatmaps
from apps.benchmarks.framework.protocol import BadInput
from apps.benchmarks.framework.runner import draw_subsets, load_model, run_benchmark
from tests.benchmark_data import write_tiny_clip
from tests.temporal_data import RELEASE_CLASSES, write_bbox_folder, write_followup_folder, write_release_pairs


def run(protocol, root, spec, n_boot=50):
    draw = draw_subsets(protocol, root)
    return run_benchmark(protocol, draw, load_model(protocol, spec, "sqlite:///unused.db"), root, n_boot=n_boot,
                         cache_dir=None, batch_size=8)  # fmt: skip


# --- grounding ---------------------------------------------------------------------------------------------------


def test_the_grounding_draw_keeps_the_release_frame_on_every_box(tmp_path):
    write_bbox_folder(tmp_path, n=12, stored=64)  # boxes in the release's 1024 frame, images stored at 64 px
    draw = draw_subsets(load_protocol("nih-grounding"), tmp_path)
    truth = draw.test.targets
    assert len(draw.test) == 12 and truth.names[2] == "Effusion"
    assert truth.labels[:, truth.names.index("Effusion")].tolist() == [int(i % 2 == 0) for i in range(12)]
    first = {box.finding: box for box in truth.boxes[0]}
    assert first["Effusion"].frame_width == 1024 and first["Effusion"].x == 384.0  # 3/8 of the 1024 frame
    assert first["Effusion"].in_frame(64, 64).x == 24.0  # where it lies on the 64-px stored image


def test_the_centre_prior_points_at_central_boxes_and_misses_corner_ones(tmp_path):
    write_bbox_folder(tmp_path, n=8)
    result = run(load_protocol("nih-grounding"), tmp_path, write_tiny_clip(tmp_path / "clip"))
    values = result.table.set_index(["protocol", "metric"])["value"]
    assert values[("centre", "pg/effusion")] == 1.0 and values[("centre", "pg/nodule")] == 0.0
    assert values[("centre", "pg/overall")] == pytest.approx(4 / 9)  # 4 central hits of 9 (image, finding) pairs
    assert np.isnan(values[("centre", "pg/atelectasis")])  # no box of it in this data
    assert 0 <= values[("random", "pg/overall")] <= 1 and np.isfinite(values[("model", "cnr/overall")])
    again = run(load_protocol("nih-grounding"), tmp_path, write_tiny_clip(tmp_path / "clip"))
    pd.testing.assert_frame_equal(result.table, again.table)  # the random floor is seeded


def test_a_box_finding_the_protocol_does_not_know_is_named(tmp_path):
    write_bbox_folder(tmp_path, n=4)
    text = (tmp_path / "BBox_List_2017.csv").read_text().replace("Nodule", "Fracture")
    (tmp_path / "BBox_List_2017.csv").write_text(text)
    with pytest.raises(BadInput, match="Fracture"):
        draw_subsets(load_protocol("nih-grounding"), tmp_path)


def test_grounding_through_the_command_line_logs_metrics_and_overlays(tmp_path, capsys):
    write_bbox_folder(tmp_path / "data", n=8)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    argv = ["--name", "nih-grounding", "--model", write_tiny_clip(tmp_path / "clip"), "--data-root",
            str(tmp_path / "data"), "--n-boot", "20", "--tracking-uri", uri, "--artifact-root",
            str(tmp_path / "artifacts"), "--no-cache"]  # fmt: skip
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "| Pointing game, Effusion | " in out and "| metric (95% CI) | Model | Centre prior | Random |" in out
    client = MlflowClient(uri)
    run_ = client.search_runs([client.get_experiment_by_name("benchmark-nih-grounding").experiment_id])[0]
    assert run_.data.metrics["centre/pg/effusion"] == 1.0
    artifacts = {a.path for a in client.list_artifacts(run_.info.run_id)}
    assert {"overlays_effusion.png", "overlays_nodule.png"} <= artifacts


# --- progression -------------------------------------------------------------------------------------------------


def test_nih_follow_ups_become_coarse_pairs_in_chexpert_names_all_scored_in_patient_disjoint_folds(tmp_path):
    write_followup_folder(tmp_path, patients=30)
    protocol = load_protocol("chextemporal")
    draw = draw_subsets(protocol, tmp_path)
    assert draw.params["source"] == "nih" and protocol.classes == ("new", "persisting", "resolved")
    assert list(draw.subsets) == ["test"]  # nothing held out: every labelled pair is scored
    table = draw.test.table
    assert set(table["finding"]) == {"Pleural Effusion"}  # NIH's Effusion, CheXpert's name
    expected = {"new": 10, "persisting": 30, "resolved": 10}  # 10 patients per pattern; absent-absent is no pair
    assert table["progression"].value_counts().to_dict() == expected
    assert table.groupby("patient_id")["fold"].nunique().max() == 1  # a patient's pairs share one fold
    assert sorted(table["fold"].unique()) == list(range(5)) == list(range(draw.params["folds"]))


def test_every_pair_is_predicted_once_by_fits_that_never_saw_its_patient(tmp_path, monkeypatch):
    write_followup_folder(tmp_path, patients=30)
    protocol = load_protocol("chextemporal")
    calls = []

    def recording(folds, fit_predict):
        def recorded(train, rows):
            calls.append((train, rows))
            return fit_predict(train, rows)

        return out_of_fold(folds, recorded)

    monkeypatch.setattr(chextemporal, "out_of_fold", recording)
    result = run(protocol, tmp_path, write_tiny_clip(tmp_path / "clip"))
    table, scores = result.draw.test.table, result.scores
    patients = table["patient_id"].to_numpy()
    assert len(calls) == 3 * 5  # rule, head and majority, once per fold
    for method in range(3):
        tested = np.concatenate([rows for _, rows in calls[5 * method : 5 * method + 5]])
        assert sorted(tested.tolist()) == list(range(len(table)))  # each pair in exactly one test fold
    for train, rows in calls:
        assert not set(patients[train]) & set(patients[rows])
        assert set(train.tolist()) | set(rows.tolist()) == set(range(len(table)))
    assert scores["pair_id"].tolist() == table["pair_id"].tolist() and scores["pair_id"].is_unique
    for method in ("zero_shot", "rule", "head", "majority"):
        assert scores[f"{method}_predicted"].notna().all() and result.params[f"scored_{method}"] == len(table)


def test_progression_methods_beside_the_out_of_fold_majority_floor(tmp_path):
    write_followup_folder(tmp_path, patients=30)
    protocol = load_protocol("chextemporal")
    result = run(protocol, tmp_path, write_tiny_clip(tmp_path / "clip"))
    values = result.table.set_index(["protocol", "metric"])["value"]
    table = result.draw.test.table
    expected = []  # the majority of the other folds' labels, ties to the earlier class
    for fold in table["fold"]:
        counts = table.loc[table["fold"] != fold, "progression"].value_counts()
        expected.append(
            max(protocol.classes, key=lambda c, counts=counts: (counts.get(c, 0), -protocol.classes.index(c)))
        )
    assert result.scores["majority_predicted"].tolist() == expected
    assert values[("majority", "accuracy")] == pytest.approx((table["progression"] == pd.Series(expected)).mean())
    for method in ("zero_shot", "rule", "head"):
        assert 0 <= values[(method, "accuracy")] <= 1
    assert {"confusion_head", "confusion_majority"} <= set(result.extras.tables)
    confusion = result.extras.tables["confusion_majority"].set_index("truth")
    assert int(confusion.to_numpy().sum()) == len(table)


@pytest.mark.parametrize(
    ("change", "message"),
    [({"folds": 1}, "folds must be a whole number >= 2"), ({"prompt_rule": "median"}, "prompt_rule must be one of max, mean"),
     ({"grounding_prompt": "a chest x-ray"}, "grounding_prompt 'a chest x-ray' needs {finding} exactly once"),
     ({"tolerance": -1}, "tolerance is a distance in pixels of the boxes' frame, 0 or more; got -1"),
     ({"tolerance": "15"}, "tolerance is a distance in pixels of the boxes' frame, 0 or more; got '15'"),
     ({"flat_maps": "half"}, "flat_maps must be one of miss, share, got 'half'")],
)  # fmt: skip
def test_bad_progression_settings_are_named(change, message):
    settings = yaml.safe_load((CONFIG_DIR / "chextemporal.yaml").read_text())
    settings.pop("_target_")
    with pytest.raises(ValueError, match=re.escape(message)):
        ChexTemporalProtocol(**{**settings, **change})


# --- the CheXTemporal release: five classes, boxes on either film ------------------------------------------------


def test_the_release_reads_five_classes_and_ties_boxes_to_their_film(tmp_path):
    write_release_pairs(tmp_path, patients=40)
    protocol = load_protocol("chextemporal")
    draw = draw_subsets(protocol, tmp_path)
    assert draw.params["source"] == "chextemporal" and protocol.classes == RELEASE_CLASSES
    table, boxes = draw.test.table, draw.test.targets.boxes
    for label, its_boxes in zip(table["progression"], boxes, strict=True):
        films = sorted(box.image for box in its_boxes)
        expected = {"new": ["path"], "resolved": ["prior_path"]}.get(label, ["path", "prior_path"])
        assert films == expected and all(box.frame_width == 1024 for box in its_boxes)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"image": "prior", "pair_id": "pair000"}, "a new finding is absent from the prior film"),
        ({"image": "current", "pair_id": "pair004"}, "a resolved finding is absent from the current film"),
        ({"pair_id": "pair999"}, "'pair999' has no pair with this box's finding"),
        ({"w": "-5"}, "a box needs a positive width and height"),
        ({"x": "1000"}, "outside the right edge of its 1024 x 1024 frame"),
    ],
)
def test_bad_release_boxes_are_named(tmp_path, change, message):
    write_release_pairs(tmp_path, patients=10)
    boxes = pd.read_csv(tmp_path / "chextemporal_boxes.csv", dtype=str, keep_default_na=False)
    for column, value in change.items():
        boxes.loc[0, column] = value
    boxes.to_csv(tmp_path / "chextemporal_boxes.csv", index=False)
    with pytest.raises(BadInput, match=re.escape(message)) as error:
        draw_subsets(load_protocol("chextemporal"), tmp_path)
    assert "chextemporal_boxes.csv line 2" in str(error.value)


def chextemporal_with(tmp_path, **changes):
    """The shipped CheXTemporal protocol with ``changes`` to its YAML's top-level settings."""
    settings = yaml.safe_load((CONFIG_DIR / "chextemporal.yaml").read_text())
    settings.pop("_target_")
    return ChexTemporalProtocol(**{**settings, **changes})


def test_release_grounding_prompts_single_image_models_with_the_disease_name_beside_the_floors(tmp_path, monkeypatch):
    write_release_pairs(tmp_path, patients=40)
    prompts, settings = {}, []

    def recording(encoder, root, paths, boxes, findings, seed, *args, **kwargs):
        prompt = encoder.targets[encoder.column("Pleural Effusion")].positive_prompt
        prompts.update({path: prompt for path in paths})
        settings.append((kwargs["tolerance"], kwargs["flat_maps"]))
        return score_heatmaps(encoder, root, paths, boxes, findings, seed, *args, **kwargs)

    monkeypatch.setattr(chextemporal, "score_heatmaps", recording)
    result = run(load_protocol("chextemporal"), tmp_path, write_tiny_clip(tmp_path / "clip"))
    # every film is grounded with the disease name, whatever its pair's change: each map is of one film
    assert set(prompts.values()) == {"pleural effusion"} and len(prompts) == 64  # 8 new + 8 resolved one film each
    assert settings == [(15.0, "miss")]  # one pass, TorchRay's 15 px, flat maps no credit
    assert result.encoder.targets[0].positive_prompt == "a chest x-ray showing atelectasis"  # the model is unchanged
    table = result.extras.tables["grounding"].set_index(["method", "metric", "group"])
    assert table.loc[("centre", "pg", "overall"), "value"] == 1.0  # every box is centred
    assert {"Pleural Effusion", "source A", "source B"} <= set(table.index.get_level_values("group"))
    films = sum(len({b.image for b in boxes}) for boxes in result.draw.test.targets.boxes)
    section = next(s for s in result.extras.sections if s.startswith("**Grounding**"))
    assert section.startswith(
        f"**Grounding** ({films} films with boxes of their pair's finding; pointing game: a hit within 15 px of a box "
        "in the boxes' frame (TorchRay's default), a flat map points nowhere and scores 0 (the platform's rule); "
        "prompts: the disease name (the paper's rule for single-image models); 95% CI"
    )
    assert "e.g. 'pleural effusion'" in section
    assert result.extras.metrics["grounding/centre/pg/overall"] == 1.0
    assert result.params["pointing_tolerance"] == 15.0 and result.params["flat_maps"] == "miss"


def shift_boxes(root, corner: int) -> None:
    """Move every box of the release so its top-left corner is at ``(corner, corner)`` of the 1024 frame."""
    boxes = pd.read_csv(root / "chextemporal_boxes.csv", dtype=str, keep_default_na=False)
    boxes["x"] = boxes["y"] = str(corner)
    boxes.to_csv(root / "chextemporal_boxes.csv", index=False)


def test_the_pointing_tolerance_is_a_setting_that_moves_the_score(tmp_path):
    write_release_pairs(tmp_path, patients=10)
    # At 32 px a heatmap pixel spans 32 px of the 1024 frame. The box's pixels start at (17, 17); the centre
    # prior's first maximum is (15, 15), 2 pixels away on each axis: sqrt(2) * 64 = 90.5 frame px from the box.
    shift_boxes(tmp_path, 544)
    clip = write_tiny_clip(tmp_path / "clip")
    pg = {}
    for tolerance in (15, 100):
        result = run(chextemporal_with(tmp_path, tolerance=tolerance, folds=2), tmp_path, clip, n_boot=0)
        pg[tolerance] = result.extras.metrics["grounding/centre/pg/overall"]
        section = next(s for s in result.extras.sections if s.startswith("**Grounding**"))
        assert f"a hit within {tolerance} px of a box" in section
    assert pg == {15: 0.0, 100: 1.0}


def test_a_flat_map_earns_no_pointing_credit_unless_the_share_rule_is_chosen(tmp_path, monkeypatch):
    write_release_pairs(tmp_path, patients=10)
    monkeypatch.setattr(grounding, "heatmaps", lambda encoder, images, findings: np.ones(
        (len(images), len(findings), encoder.image_size, encoder.image_size), np.float32))  # fmt: skip
    clip = write_tiny_clip(tmp_path / "clip")
    result = run(chextemporal_with(tmp_path, folds=2), tmp_path, clip, n_boot=0)
    boxes = [b for pair in result.draw.test.targets.boxes for b in pair]
    assert result.extras.metrics["grounding/model/pg/overall"] == 0.0
    assert result.extras.metrics["grounding/centre/pg/overall"] == 1.0  # a map that points still scores
    section = next(s for s in result.extras.sections if s.startswith("**Grounding**"))
    assert f"{len(boxes)} of {len(boxes)} model heatmaps are flat (no pixel stands out): each scores 0 in" in section
    shared = run(chextemporal_with(tmp_path, flat_maps="share", folds=2), tmp_path, clip, n_boot=0)
    share = hit_region([boxes[0]], 32, 15).mean()  # every box is the same centred box: one share for every film
    assert 0 < share < 1 and shared.extras.metrics["grounding/model/pg/overall"] == pytest.approx(share)
    assert "a flat map scores the share of pixels that would be hits" in "\n".join(shared.extras.sections)
