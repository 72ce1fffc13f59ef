"""Benchmarks as plug-ins: the catalog of configs/benchmark/, the YAML -> protocol loading, the command line's
messages, the interface types, and a toy protocol of another shape (image pairs, two findings, three readers, two
sites, plain bootstrap, extras beyond its table) run through the same shared runner and command line as
pneumonia."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from mlflow import MlflowClient
from sklearn.metrics import cohen_kappa_score

from apps.benchmarks import cli
from apps.benchmarks.framework import runner
from apps.benchmarks.framework.catalog import CONFIG_DIR, available, load_protocol
from apps.benchmarks.framework.encoders import Encoded, Encoder, Target
from apps.benchmarks.framework.protocol import BOOTSTRAPS, BadInput, Box, Extras, Features, Prediction, Targets
from apps.benchmarks.framework.report import render_report
from apps.benchmarks.framework.runner import draw_subsets, load_model, run_benchmark
from apps.benchmarks.framework.sampling import fingerprint
from evaluation.bootstrap import percentile_ci, resample_indices
from tests.benchmark_data import (
    FINDINGS,
    READERS,
    ToyProgressionProtocol,
    toy_reading,
    toy_site,
    toy_truth,
    write_pairs,
    write_tiny_clip,
    write_toy_config,
)

# --- catalog and command line ------------------------------------------------------------------------------------


def test_every_config_is_listed_with_its_description_and_loads_as_its_name():
    listed = available()
    assert "pneumonia" in listed and listed["pneumonia"].startswith("Pediatric pneumonia (Kermany 2018)")
    assert listed["pneumonia"].endswith("[versions: full, n100]")
    for name in listed:
        assert load_protocol(name).name == name  # the file stem, the NAME= and the experiment name agree


def test_no_name_lists_the_protocols_and_exits_zero(capsys, tmp_path):
    assert cli.main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Benchmark protocols (configs/benchmark/):\n")
    width = max(len(name) for name in available())  # names aligned in one column
    assert f"\n  {'pneumonia':<{width}}  Pediatric pneumonia" in out and f"\n  {'reveal':<{width}}  REVEAL-CXR" in out
    assert "Run one: make benchmark NAME=<name>" in out
    assert cli.main(["--config-dir", str(write_toy_config(tmp_path / "configs"))]) == 0
    assert "  toy  Toy reader study: did each finding worsen between two films? [versions: all, first12]" in (
        capsys.readouterr().out
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--name", "pneumonai", "--model", "clip:x", "--data-root", "."],
         f"make benchmark: unknown benchmark 'pneumonai'; known: {', '.join(available())} (configs in {CONFIG_DIR})"),
        (["--name", "pneumonia", "--model", "clip:x", "--data-root", ".", "--version", "n50"],
         "make benchmark: unknown version 'n50' of benchmark pneumonia; choose one of full, n100"),
        (["--name", "pneumonia", "--model", "clip:x", "--data-root", "/nonexistent/kermany"],
         "make benchmark: data root /nonexistent/kermany is not a folder (benchmark pneumonia reads its data set"),
        (["--name", "pneumonia", "--data-root", "."],
         "make benchmark: benchmark pneumonia needs MODEL (--model); usage:"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_naming_it_and_exit_2(argv, message, capsys):
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(message) and captured.err.count("\n") == 1 and "Traceback" not in captured.err
    assert captured.out == ""


def test_a_config_must_name_its_file_and_target_a_protocol(tmp_path):
    (tmp_path / "mismatch.yaml").write_text("_target_: tests.benchmark_data.ToyProgressionProtocol\nname: other\n")
    with pytest.raises(ValueError, match="name is 'other', expected the file's stem 'mismatch'"):
        load_protocol("mismatch", tmp_path)
    (tmp_path / "notaprotocol.yaml").write_text("_target_: builtins.dict\nname: notaprotocol\n")
    with pytest.raises(ValueError, match="is not a benchmark Protocol"):
        load_protocol("notaprotocol", tmp_path)
    with pytest.raises(BadInput, match="unknown benchmark 'nope'; known: mismatch, notaprotocol"):
        load_protocol("nope", tmp_path)


def test_the_yaml_target_and_settings_build_the_toy_protocol(tmp_path):
    protocol = load_protocol("toy", write_toy_config(tmp_path))
    assert isinstance(protocol, ToyProgressionProtocol)
    assert (protocol.name, protocol.seed, protocol.bootstrap, protocol.default_version) == ("toy", 7, "plain", "all")
    assert [t.label for t in protocol.targets] == list(FINDINGS)
    assert protocol.targets[1].positive_prompt == "a chest x-ray with pulmonary edema"
    with pytest.raises(ValueError, match="bootstrap must be one of"):
        ToyProgressionProtocol("toy", "", 7, {"all": None}, list(FINDINGS), {f: f for f in FINDINGS}, "jackknife")


# --- the interface types -----------------------------------------------------------------------------------------


def test_a_box_moves_between_pixel_frames():
    box = Box("Nodule", x=100, y=50, w=200, h=100, frame_width=1000, frame_height=500)
    moved = box.in_frame(224, 224)
    assert (moved.x, moved.y, moved.w, moved.h) == pytest.approx((22.4, 22.4, 44.8, 44.8))
    assert (moved.frame_width, moved.frame_height, moved.finding) == (224, 224, "Nodule")
    back = moved.in_frame(1000, 500)
    assert (back.x, back.y, back.w, back.h) == pytest.approx((100, 50, 200, 100))


def test_targets_resample_every_per_item_field_together():
    boxes = ((Box("A", 0, 0, 1, 1, 4, 4),), (), (Box("B", 1, 1, 2, 2, 4, 4), Box("A", 0, 0, 2, 2, 4, 4)))
    targets = Targets(
        "multilabel", ("A", "B"), np.array([[1, 0], [0, 0], [1, 1]]), readers=("r1", "r2"),
        reader_labels=np.array([[[1, 0], [1, 1]], [[0, 0], [0, 1]], [[1, 1], [1, 1]]]), boxes=boxes,
        texts=("a", "none", "a and b"), concepts=(frozenset({"C1"}), frozenset(), frozenset({"C1", "C2"})),
        groups=np.array(["low", "high", "high"]),
    )  # fmt: skip
    index = np.array([2, 2, 0])
    taken = targets.take(index)
    assert taken.labels.tolist() == [[1, 1], [1, 1], [1, 0]] and taken.reader_labels.shape == (3, 2, 2)
    assert taken.groups.tolist() == ["high", "high", "low"]
    assert taken.boxes == (boxes[2], boxes[2], boxes[0]) and taken.texts == ("a and b", "a and b", "a")
    assert taken.concepts[2] == frozenset({"C1"}) and taken.names == ("A", "B") and taken.readers == ("r1", "r2")
    prediction = Prediction(np.array([0.1, 0.2, 0.3]), np.array([False, False, True]), texts=("x", "y", "z"))
    assert prediction.take(index).texts == ("z", "z", "x") and prediction.take(index).scores.tolist() == [0.3, 0.3, 0.1]
    # The fingerprint records everything a reference holds: one reader's changed call changes it.
    ids = ["s1", "s2", "s3"]
    changed = targets.reader_labels.copy()
    changed[1, 1, 1] = 0
    other = Targets("multilabel", ("A", "B"), targets.labels, readers=("r1", "r2"), reader_labels=changed,
                    boxes=boxes, texts=targets.texts, concepts=targets.concepts, groups=targets.groups)  # fmt: skip
    assert fingerprint(ids, targets.row_keys()) != fingerprint(ids, other.row_keys())
    regrouped = dataclasses.replace(targets, groups=np.array(["low", "low", "high"]))
    assert fingerprint(ids, targets.row_keys()) != fingerprint(ids, regrouped.row_keys())
    assert fingerprint(ids[::-1], targets.row_keys()[::-1]) == fingerprint(ids, targets.row_keys())
    # A bare binary reference keeps the fingerprint the pneumonia subsets always had.
    binary = Targets("binary", ("Pneumonia",), np.array([1, 0, 1]))
    assert fingerprint(ids, binary.row_keys()) == fingerprint(ids, [1.0, 0.0, 1.0])
    # Groups are per item (text, whatever they were given as) and enter the fingerprint only when present.
    sited = Targets("binary", ("Pneumonia",), np.array([1, 0, 1]), groups=[1, 2, 2])
    assert sited.groups.tolist() == ["1", "2", "2"] and sited.take(np.array([1, 0])).groups.tolist() == ["2", "1"]
    assert fingerprint(ids, sited.row_keys()) != fingerprint(ids, binary.row_keys())
    assert '"group": "2"' in sited.row_keys()[1]


def test_targets_refuse_inconsistent_shapes():
    with pytest.raises(ValueError, match=r"must be \(2, 2\)"):
        Targets("multilabel", ("A", "B"), np.zeros(2))
    with pytest.raises(ValueError, match="class names"):
        Targets("multiclass", ("A",), np.zeros((2, 1), int))
    with pytest.raises(ValueError, match="texts has 1 entries for 2 items"):
        Targets("binary", ("A",), np.zeros(2), texts=("x",))
    with pytest.raises(ValueError, match="groups has 3 entries for 2 items"):
        Targets("binary", ("A",), np.zeros(2), groups=np.array(["a", "b", "c"]))
    with pytest.raises(ValueError, match=r"groups must be \(N,\)"):
        Targets("binary", ("A",), np.zeros(2), groups=np.array([["a"], ["b"]]))
    with pytest.raises(ValueError, match="use bootstrap: plain"):
        Targets("multilabel", ("A", "B"), np.zeros((2, 2))).strata()
    progression = Targets("multiclass", ("Effusion",), np.array([[0], [2], [1]]), classes=("better", "same", "worse"))
    assert progression.strata().tolist() == [0, 2, 1]


# --- a toy protocol of another shape through the shared runner ---------------------------------------------------


def test_encoded_outputs_and_features_keep_one_column_per_target():
    embeddings = np.zeros((3, 2), np.float32)
    scores = np.array([[0.1, np.nan], [0.7, np.nan], [0.4, np.nan]])
    decisions = np.array([[False, False], [True, False], [False, False]])
    features = Features({("test", "path"): Encoded(embeddings, scores, decisions)}, ("A", "B"))
    assert features.zero_shot("A", "test").tolist() == [0.1, 0.7, 0.4] and features.decisions("A", "test").tolist() == [
        False, True, False,
    ]  # fmt: skip
    assert np.isnan(features.zero_shot("B", "test")).all()
    assert features.get("test") is features.encoded[("test", "path")]
    bare = Features({("test", "path"): Encoded(embeddings)}, ("A",))  # a model without any zero-shot score
    assert np.isnan(bare.zero_shot("A", "test")).all() and not bare.decisions("A", "test").any()
    with pytest.raises(KeyError, match="'C' is not a target"):
        features.zero_shot("C", "test")
    with pytest.raises(ValueError, match="come together"):
        Encoded(embeddings, scores)
    with pytest.raises(ValueError, match=r"zero_shot must be \(N, T\)"):
        Encoded(embeddings, scores[:, 0], decisions[:, 0])


class HalfBrightness(Encoder):
    """Zero-shot score per target = mean brightness of the image's left half (Effusion) or right half (Edema),
    called from 0.5 on; counts the images it encoded."""

    image_size = 16

    def __init__(self, spec: str, targets: tuple[Target, ...], tracking_uri: str | None = None, seed: int = 0):
        super().__init__(spec, targets, tracking_uri, seed)
        self.sides = [0 if t.label == "Effusion" else 1 for t in self.targets]
        self.images = 0

    @property
    def identity(self) -> str:
        return self.spec

    def encode(self, images: np.ndarray) -> Encoded:
        self.images += len(images)
        halves = images.reshape(len(images), 16, 2, 8).mean(axis=(1, 3)) / 255.0  # (B, 2): left, right
        scores = halves[:, self.sides]  # (B, T)
        return Encoded(halves.astype(np.float32), scores, scores >= 0.5)


def test_one_encoder_is_loaded_and_each_image_column_encoded_once_for_two_targets(tmp_path, monkeypatch):
    write_pairs(tmp_path / "data", n=24)
    protocol = load_protocol("toy", write_toy_config(tmp_path / "configs"))
    draw = draw_subsets(protocol, tmp_path / "data")
    loads, encodes = [], []
    real_encode_subset = runner.encode_subset

    def spy_load(spec, targets, tracking_uri, seed=0):
        loads.append((spec, tuple(targets), seed))
        return HalfBrightness(spec, targets, tracking_uri, seed)

    def spy_encode(encoder, root, table, key, *args):
        encodes.append(key)
        return real_encode_subset(encoder, root, table, key, *args)

    monkeypatch.setattr(runner, "load_encoder", spy_load)
    monkeypatch.setattr(runner, "encode_subset", spy_encode)
    encoder = load_model(protocol, "halves", "sqlite:///unused.db")
    assert loads == [("halves", tuple(protocol.targets), 7)]  # one load answering both findings
    result = run_benchmark(protocol, draw, encoder, tmp_path / "data", n_boot=20, cache_dir=None)
    fp = draw.test.fingerprint
    assert encodes == [f"{fp}:prior_path", fp] and encoder.images == 2 * 24  # once per column, not per target
    assert result.encoder is encoder and result.scores["model_change_edema"].notna().all()

    def failing_load(spec, targets, tracking_uri, seed=0):
        raise LookupError("no run 'deadbeef'")

    monkeypatch.setattr(runner, "load_encoder", failing_load)
    with pytest.raises(BadInput, match="model 'deadbeef': no run 'deadbeef'"):
        load_model(protocol, "deadbeef", "sqlite:///unused.db")
    with pytest.raises(ValueError, match=r"does not answer target\(s\) \['Edema'\]"):
        run_benchmark(protocol, draw, HalfBrightness("halves", protocol.targets[:1]), tmp_path / "data", n_boot=0)


def test_pairs_with_three_readers_and_two_findings_run_through_the_shared_runner(tmp_path):
    write_pairs(tmp_path / "data", n=24)
    protocol = load_protocol("toy", write_toy_config(tmp_path / "configs"))
    draw = draw_subsets(protocol, tmp_path / "data")
    assert draw.version == "all" and len(draw.test) == 24
    truth = draw.test.targets
    assert truth.labels.tolist() == [list(toy_truth(i)) for i in range(24)]  # the majority of the three readers
    assert truth.boxes[0][0] == Box("Effusion", 0, 0, 8, 16, 16, 16, reader="reader_a")
    assert truth.texts[1] == "effusion stable; edema worse"
    assert truth.groups.tolist() == [toy_site(i) for i in range(24)]
    encoder = HalfBrightness("halves", protocol.targets)
    result = run_benchmark(protocol, draw, encoder, tmp_path / "data", n_boot=300, cache_dir=tmp_path / "cache")
    # Every image column of every subset through the one encoder, each column with its own cache entry.
    assert encoder.images == 48 and len(list((tmp_path / "cache").glob("*.npz"))) == 2
    table = result.table.set_index(["protocol", "metric"])
    assert len(result.table) == 4 * 3
    # The model sees exactly which half brightened: perfect agreement with the majority, and reader_a is it.
    for method in ("model", "reader_a"):
        assert table.loc[(method, "kappa_mean"), ["value", "ci_low", "ci_high"]].tolist() == [1.0, 1.0, 1.0]
    # reader_b misreads Effusion on items 1, 5, 9, ...: kappa against the majority, as scikit-learn computes it.
    reader_b = np.array([toy_reading(i, "reader_b")[0] for i in range(24)])
    expected = cohen_kappa_score(truth.labels[:, 0], reader_b)
    assert table.loc[("reader_b", "kappa_effusion"), "value"] == pytest.approx(expected)
    assert table.loc[("reader_b", "kappa_edema"), "value"] == 1.0
    # Plain bootstrap over studies: resample b is evaluation.bootstrap's, with the protocol's seed.
    replicates = [cohen_kappa_score(truth.labels[idx, 0], reader_b[idx]) for idx in resample_indices(24, 300, 7)]
    low, high = percentile_ci(np.array(replicates))
    assert table.loc[("reader_b", "kappa_effusion"), "ci_low"] == pytest.approx(low)
    assert table.loc[("reader_b", "kappa_effusion"), "ci_high"] == pytest.approx(high)
    assert BOOTSTRAPS[protocol.bootstrap][0] == "of the test items"
    assert result.metrics()["reader_c/kappa_edema"] < 1.0 and list(result.scores.columns) == [
        "item_id", "model_change_effusion", "model_change_edema",
    ]  # fmt: skip
    # The extras: per-site kappas from the groups (reader_b's Effusion misreads on the ward's items 1 and 13).
    by_site = result.extras.tables["kappa_by_site"].set_index(["site", "method"])
    ward = [i for i in range(24) if toy_site(i) == "ward"]
    expected_ward = cohen_kappa_score(truth.labels[ward, 0], reader_b[ward])
    assert by_site.loc[("ward", "reader_b"), "kappa_mean"] == pytest.approx((expected_ward + 1.0) / 2)
    assert by_site.loc[("clinic", "model"), "kappa_mean"] == 1.0 and by_site.loc[("ward", "model"), "n"] == 12
    weakest = min(table.loc[(r, "kappa_mean"), "value"] for r in READERS)
    assert result.metrics()["readers/weakest_kappa_mean"] == weakest and "readers/undefined" not in result.metrics()
    again = run_benchmark(protocol, draw, encoder, tmp_path / "data", n_boot=300, cache_dir=tmp_path / "cache")
    assert again.cache_hits == {"test": True} and encoder.images == 48
    pd.testing.assert_frame_equal(again.table, result.table)
    # A protocol may lay out its own table; the report prints it instead of the generic one, extras after notes.
    report = render_report(result)
    assert "| metric (95% CI) | Model | Reader A | Reader B | Reader C |" in report
    assert report.index("- embeddings from the cache") < report.index("## Mean kappa by site\n")
    custom = type("Custom", (ToyProgressionProtocol,), {"report_table": lambda self, result: "CUSTOM TABLE"})
    custom = custom("toy", "", 7, {"all": None}, list(FINDINGS), {f: f for f in FINDINGS})
    report = render_report(dataclasses.replace(result, protocol=custom))
    assert "\nCUSTOM TABLE\n" in report and "| metric (95% CI) |" not in report


def test_extras_may_not_overwrite_the_runs_own_artifacts_or_metrics(tmp_path):
    write_pairs(tmp_path / "data", n=12)
    encoder = HalfBrightness("halves", tuple(load_protocol("toy", write_toy_config(tmp_path / "c")).targets))
    for extras, message in ((Extras(tables={"scores": pd.DataFrame()}), "extra table name"),
                            (Extras(figures={"subsets/test": None}), "extra figure name"),
                            (Extras(metrics={"model/kappa_mean": 0.5}), "extra metric")):  # fmt: skip
        clashing = type("Clashing", (ToyProgressionProtocol,), {"extras": lambda self, *args, e=extras: e})
        protocol = clashing("toy", "", 7, {"all": None}, list(FINDINGS), {f: f for f in FINDINGS})
        with pytest.raises(ValueError, match=message):
            run_benchmark(protocol, draw_subsets(protocol, tmp_path / "data"), encoder, tmp_path / "data", n_boot=0,
                          cache_dir=None)  # fmt: skip


def test_the_toy_protocol_through_the_command_line_into_mlflow(tmp_path, capsys):
    write_pairs(tmp_path / "data", n=24)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    argv = ["--name", "toy", "--config-dir", str(write_toy_config(tmp_path / "configs")), "--version", "first12",
            "--model", write_tiny_clip(tmp_path / "tiny"), "--data-root", str(tmp_path / "data"), "--n-boot", "50",
            "--tracking-uri", uri, "--cache-dir", str(tmp_path / "cache"),
            "--artifact-root", str(tmp_path / "art")]  # fmt: skip
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("# Benchmark toy (first12)\n") and "- test: 12 studies" in out
    assert "50 bootstrap resamples of the test items" in out
    assert "| metric (95% CI) | Model | Reader A | Reader B | Reader C |" in out and "| Kappa, Effusion |" in out
    assert "\n## Mean kappa by site\n\n| site | method | items | mean kappa |\n" in out
    assert "| ward | reader_a | 6 | 1.000 |" in out
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("benchmark-toy").experiment_id])
    params, tags, metrics = run.data.params, run.data.tags, run.data.metrics
    assert params["n_test"] == "12" and params["readers"] == "3" and params["zero_shot"] == "margin"
    assert params["test_fingerprint"] == tags["benchmark.test_fingerprint"] and params["seed"] == "7"
    assert metrics["reader_a/kappa_mean"] == 1.0 and metrics["reader_a/kappa_mean_ci_low"] == 1.0
    reader_c = [toy_reading(i, "reader_c")[1] for i in range(12)]
    edema = [toy_truth(i)[1] for i in range(12)]
    assert metrics["reader_c/kappa_edema"] == pytest.approx(cohen_kappa_score(edema, reader_c))
    folder = client.download_artifacts(run.info.run_id, "", str(tmp_path / "dl"))
    subset = pd.read_csv(f"{folder}/subsets/test.csv")
    assert list(subset.columns[:3]) == ["item_id", "prior_path", "path"] and len(subset) == 12
    assert len(pd.read_csv(f"{folder}/table.csv")) == 4 * 3 and set(READERS) < set(
        pd.read_csv(f"{folder}/table.csv")["protocol"]
    )
    # The protocol's extras: a table, a figure, a section (in table.md too), a metric and a param.
    by_site = pd.read_csv(f"{folder}/kappa_by_site.csv")
    assert list(by_site.columns) == ["site", "method", "n", "kappa_mean"] and len(by_site) == 2 * 4
    assert set(by_site["site"]) == {"ward", "clinic"} and (by_site["n"] == 6).all()
    with open(f"{folder}/kappa_mean.png", "rb") as png:
        assert png.read(8) == b"\x89PNG\r\n\x1a\n"
    with open(f"{folder}/table.md") as markdown:
        assert "## Mean kappa by site" in markdown.read()
    weakest = min(metrics[f"{reader}/kappa_mean"] for reader in READERS)
    assert metrics["readers/weakest_kappa_mean"] == weakest and "readers/undefined" not in metrics
    assert params["sites"] == "clinic, ward"
    assert params["zero_shot"] == "margin" and tags["zero_shot_available"] == "true"
    import matplotlib.pyplot as plt

    assert plt.get_fignums() == []  # every figure closed once logged
