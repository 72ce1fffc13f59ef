"""REVEAL-CXR as a benchmark plug-in: reading the release and reader tables (and their named errors), the label
mapping, the model's metrics by agreement stratum, the readers' agreement beside the model, the acquisition
balance, the command line into MLflow, and a DICOM copy scoring exactly like its PNGs."""

from __future__ import annotations

import dataclasses
import re
import subprocess

import numpy as np
import pandas as pd
import pytest
import yaml
from mlflow import MlflowClient
from scipy.stats import chi2_contingency
from sklearn.metrics import average_precision_score, cohen_kappa_score, f1_score, roc_auc_score

from apps.benchmarks import cli
from apps.benchmarks.framework.catalog import CONFIG_DIR, load_protocol
from apps.benchmarks.framework.protocol import BadInput, Prediction
from apps.benchmarks.framework.runner import draw_subsets, load_model, run_benchmark
from apps.benchmarks.reveal.demographics import demographics
from apps.benchmarks.reveal.reader_study import read_reader_table, read_release
from tests.benchmark_data import write_tiny_clip
from tests.conftest import PROJECT_ROOT
from tests.dicom_files import write_display_dicom
from tests.reveal_data import RATERS, READERS, dicom_copy, truth, write_reader_folder, write_release_folder
from training.data.label_names import REVEAL_LABELS, REVEAL_OUTPUTS

pytest.importorskip("pydicom")


def reveal(tmp_path=None, **changes):
    """The shipped protocol, or a copy of its YAML with ``changes`` (``readers.subset`` style keys)."""
    if not changes:
        return load_protocol("reveal")
    config = yaml.safe_load((CONFIG_DIR / "reveal.yaml").read_text())
    for dotted, value in changes.items():
        section, _, key = dotted.rpartition(".")
        (config[section] if section else config)[key] = value
    folder = tmp_path / "configs"
    folder.mkdir(exist_ok=True)
    (folder / "reveal.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return load_protocol("reveal", folder)


# --- reading -----------------------------------------------------------------------------------------------------


def test_a_reader_table_gives_the_majority_the_readers_the_blanks_and_the_strata(tmp_path):
    write_reader_folder(tmp_path, n=24)
    study = read_reader_table(tmp_path, reveal().readers, REVEAL_LABELS)
    assert study.names == ("airspace opacity", "lung mass", "lung nodule", "pneumothorax")  # benchmark order
    assert study.readers == tuple(sorted(READERS)) and study.readers[0] == "0042"  # text ids, leading zero kept
    expected = np.array([[truth(i)[c] for c in ("airspace_opacity", "nodule_mass", "nodule_mass", "pneumothorax")]
                         for i in range(24)])  # fmt: skip
    np.testing.assert_array_equal(study.reference, expected)  # one reader errs at most: the majority is the truth
    hedger = study.readers.index("4326829894")
    assert (study.reads[1, hedger, 1:3] == -1).all() and study.reads[1, hedger, 0] == truth(1)["airspace_opacity"]
    assert (study.reads.reshape(24, -1) != -1).sum(axis=1).min() > 0
    assert ((study.reads != -1).any(axis=2).sum(axis=1) == 3).all()  # three readers per image, -1 for the fourth
    blanks = study.blanks.set_index(["reader", "label"])
    assert blanks.loc[("4326829894", "lung nodule"), "blank"] == 1 and blanks["blank"].sum() == 2
    assert blanks.loc[("0042", "pneumothorax"), "asked"] == 18  # reads on 3 of every 4 images
    # 0042 misreads opacity on images 1, 5, 9, ...: those are "2 of 3", the rest "3 of 3"
    misread = {i for i in range(24) if i % 4 == 1 and "0042" in [READERS[(i + r) % 4] for r in range(3)]}
    assert misread and study.table["stratum"].tolist() == ["2 of 3" if i in misread else "3 of 3" for i in range(24)]
    assert study.table["patient_id"].iloc[0] == "00000" and set(study.absent) == set(REVEAL_LABELS) - set(study.names)
    assert any("nodule_mass is read as lung nodule and as lung mass" in note for note in study.notes)
    assert "view" in study.table.columns  # study attributes from the adjudicated table


def test_the_adjudicated_reference_replaces_the_majority(tmp_path):
    write_reader_folder(tmp_path, n=10)
    table = pd.read_csv(tmp_path / "adjudicated.csv", dtype=str)
    table.loc[3, "pneumothorax"] = "1"  # the adjudicators overrule the readers on one image
    table.to_csv(tmp_path / "adjudicated.csv", index=False)
    majority = read_reader_table(tmp_path, reveal().readers, REVEAL_LABELS)
    adjudicated = read_reader_table(tmp_path, reveal().readers, REVEAL_LABELS, reference="adjudicated")
    k = majority.names.index("pneumothorax")
    assert majority.reference[3, k] == 0 and adjudicated.reference[3, k] == 1
    assert (majority.reference != adjudicated.reference).sum() == 1


def corrupt(kind, root):
    reads = pd.read_csv(root / "reads.csv", dtype=str, keep_default_na=False)
    if kind == "duplicate":
        pd.concat([reads, reads.iloc[[4]]]).to_csv(root / "reads.csv", index=False)
    elif kind == "unknown column":
        reads.assign(effusion="0").to_csv(root / "reads.csv", index=False)
    elif kind == "bad value":
        reads.loc[5, "pneumothorax"] = "maybe"
        reads.to_csv(root / "reads.csv", index=False)
    elif kind == "missing image":
        (root / reads["image"][0]).unlink()
    elif kind == "no pixel data":
        dicom_copy(root, root / "dicom")
        write_display_dicom(root / "dicom" / reads["image"][0].replace(".png", ".dcm"), np.zeros((4, 4), np.uint8),
                    pixel_data=False)  # fmt: skip
        return root / "dicom"
    return root


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("duplicate", "reads.csv lines 6, 74: reader 4326829894 read image images/00000001_000.png more than once"),
        ("unknown column", "reads.csv: column(s) effusion are not findings this benchmark knows; map them under "
                           "readers.findings"),
        ("bad value", "reads.csv line 7, column pneumothorax: 'maybe' is not 0/1 or empty"),
        ("missing image", "reads.csv: 1 image(s) not found under "),
        ("no pixel data", "00000000_000.dcm: DICOM file without pixel data"),
    ],
)  # fmt: skip
def test_bad_reader_input_is_one_named_error(tmp_path, kind, message):
    write_reader_folder(tmp_path, n=24)
    root = corrupt(kind, tmp_path)
    with pytest.raises(BadInput, match=re.escape(message)) as error:
        draw_subsets(reveal(), root)
    if kind == "missing image":
        assert str(error.value).endswith(": images/00000000_000.png")


def test_the_command_line_names_a_bad_table_in_one_line(tmp_path, capsys):
    write_reader_folder(tmp_path, n=8)
    corrupt("duplicate", tmp_path)
    assert cli.main(["--name", "reveal", "--model", "clip:x", "--data-root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "more than once" in err and "Traceback" not in err


def test_the_release_layout_reads_labels_agreement_and_the_frontal_dicom(tmp_path):
    table = write_release_folder(tmp_path, n=12)
    protocol = reveal()
    study = read_release(tmp_path, protocol.release, REVEAL_LABELS)
    assert study.names == ("airspace opacity", "lung nodule", "pneumothorax") and study.reads is None
    assert study.table["path"].tolist() == [f"images/REVEAL-{i:03d}/2_frontal.dcm" for i in range(12)]
    assert study.table["stratum"].tolist() == ["2 of 3" if i % 3 == 0 else "3 of 3" for i in range(12)]
    np.testing.assert_array_equal(study.reference[:, 0], table["airspace_opacity"].to_numpy())
    assert study.absent["aneurysm"] == "labels.csv has no column aneurysm"


@pytest.mark.parametrize(("merge", "levels"), [(True, ["1 of 3", "2 of 3"]), (False, ["2 of 3", "3 of 3"])])
def test_agree_mostly_counts_as_disagreement_unless_told_otherwise(tmp_path, merge, levels):
    write_release_folder(tmp_path, n=2)
    table = pd.read_csv(tmp_path / "labels.csv", dtype=str)
    ratings = {
        "r1": ["Agree all", "Agree all"],
        "r2": ["Agree mostly", "Agree all"],
        "r3": ["Disagree", "agree mostly"],
    }
    table.assign(**ratings).to_csv(tmp_path / "labels.csv", index=False)
    protocol = reveal(tmp_path, **{"release.ratings": ["r1", "r2", "r3"]})
    study = read_release(tmp_path, protocol.release, REVEAL_LABELS, merge_agree_mostly=merge)
    assert study.table["stratum"].tolist() == levels


# --- label mapping and metrics -----------------------------------------------------------------------------------


def test_every_benchmark_label_has_a_documented_mapping_and_nih_outputs_map_as_stated():
    from apps.benchmarks.framework.platform_models import map_outputs

    nih = ["Atelectasis", "Cardiomegaly", "Effusion", "Infiltration", "Mass", "Nodule", "Pneumonia", "Pneumothorax",
           "Consolidation", "Edema", "Emphysema", "Fibrosis", "Pleural_Thickening", "Hernia", "No Finding"]  # fmt: skip
    targets = {t.label: t for t in reveal().targets}
    assert tuple(targets) == REVEAL_LABELS and all(REVEAL_OUTPUTS[label][1] for label in REVEAL_LABELS)
    used = {label: [nih[i] for i in map_outputs(nih, targets[label])] for label in REVEAL_LABELS}
    assert sorted(used["airspace opacity"]) == ["Consolidation", "Infiltration", "Pneumonia"]
    assert used["pleural effusion"] == ["Effusion"] and used["pleural thickening"] == ["Pleural_Thickening"]
    assert used["COPD"] == ["Emphysema"] and used["hiatal hernia"] == ["Hernia"]
    assert used["interstitial opacity"] == ["Fibrosis"] and used["lung mass"] == ["Mass"]
    assert used["aneurysm"] == [] and used["lymphadenopathy"] == []  # NIH has neither: n/a, with the reason


def test_scores_per_label_and_stratum_match_scikit_learn(tmp_path):
    write_reader_folder(tmp_path, n=24)
    protocol = reveal()
    draw = draw_subsets(protocol, tmp_path)
    truth_ = draw.test.targets
    rng = np.random.default_rng(3)
    scores = rng.random(truth_.labels.shape) + 0.4 * (truth_.labels == 1)
    calls = scores > 0.6
    values = protocol.score(truth_, Prediction(scores, calls))
    for stratum in ("all", "3 of 3", "2 of 3"):
        rows = np.ones(len(truth_), bool) if stratum == "all" else truth_.groups == stratum
        for k, label in enumerate(truth_.names):
            y, s, c = truth_.labels[rows, k], scores[rows, k], calls[rows, k]
            key = f"{stratum.replace(' ', '_')}/{label.replace(' ', '_')}"
            if 0 < y.sum() < y.size:
                assert values[f"{key}/auroc"] == pytest.approx(roc_auc_score(y, s))
                assert values[f"{key}/ap"] == pytest.approx(average_precision_score(y, s))
                assert values[f"{key}/label_kappa"] == pytest.approx(cohen_kappa_score(y, c))
                assert values[f"{key}/f1"] == pytest.approx(f1_score(y, c))
    pooled = cohen_kappa_score(truth_.labels.ravel(), calls.ravel())
    assert values["all/micro/label_kappa"] == pytest.approx(pooled)
    finite = [values[f"all/{label.replace(' ', '_')}/auroc"] for label in truth_.names]
    assert values["all/macro/auroc"] == pytest.approx(np.nanmean(finite))
    assert np.isnan(values["all/aneurysm/auroc"])  # no reference in this data


def test_a_missing_reference_is_left_out_of_that_label_only(tmp_path):
    write_reader_folder(tmp_path, n=8)
    draw = draw_subsets(reveal(), tmp_path)
    t = draw.test.targets
    labels = t.labels.copy()
    labels[0, 0] = -1
    scores = np.where(t.labels == 1, 0.9, 0.1)
    values = reveal().score(dataclasses.replace(t, labels=labels), Prediction(scores, scores > 0.5))
    assert values["all/airspace_opacity/label_kappa"] == 1.0 and values["all/pneumothorax/label_kappa"] == 1.0


# --- end to end --------------------------------------------------------------------------------------------------


def run(protocol, root, spec, n_boot=40):
    draw = draw_subsets(protocol, root)
    model = load_model(protocol, spec, "sqlite:///unused.db")
    return run_benchmark(protocol, draw, model, root, n_boot=n_boot, cache_dir=None, batch_size=8)


def test_the_dicom_copy_scores_exactly_like_the_pngs(tmp_path):
    write_reader_folder(tmp_path / "png", n=16)
    dicom_copy(tmp_path / "png", tmp_path / "dcm")
    spec = write_tiny_clip(tmp_path / "clip")
    png = run(reveal(tmp_path, **{"readers.subset": "subset"}), tmp_path / "png", spec)
    dcm = run(reveal(tmp_path, **{"readers.subset": "subset"}), tmp_path / "dcm", spec)
    pd.testing.assert_frame_equal(png.table, dcm.table)
    assert png.table["value"].notna().sum() > 20
    pd.testing.assert_frame_equal(png.extras.tables["readers_label_kappa"], dcm.extras.tables["readers_label_kappa"])
    assert "acquisition_balance" not in png.extras.tables  # PNGs carry no acquisition tags
    balance = dcm.extras.tables["acquisition_balance"].set_index("field")
    assert balance.loc["Manufacturer", "n"] == 16 and balance.loc["Manufacturer", "p_value"] < 0.001  # by design


def test_reveal_through_the_command_line_into_mlflow(tmp_path, capsys):
    write_reader_folder(tmp_path / "data", n=16)
    spec = write_tiny_clip(tmp_path / "clip")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    argv = ["--name", "reveal", "--model", spec, "--data-root", str(tmp_path / "data"), "--n-boot", "30",
            "--tracking-uri", uri, "--artifact-root", str(tmp_path / "artifacts"), "--no-cache"]  # fmt: skip
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "**Model vs the reference, all studies** (16 studies; 95% CI)" in out
    assert "| aneurysm | - | n/a: reads.csv has no column for it |" in out
    assert "**Readers' label kappa**" in out and "**Model vs readers**" in out
    assert "**Acquisition balance**: n/a (the studies are not DICOM files" in out
    client = MlflowClient(uri)
    run_ = client.search_runs([client.get_experiment_by_name("benchmark-reveal").experiment_id])[0]
    artifacts = {a.path for a in client.list_artifacts(run_.info.run_id)}
    assert {
        "readers_label_kappa.csv",
        "readers_label_kappa.png",
        "label_kappa_verdicts.csv",
        "demographics.csv",
        "label_mapping.csv",
        "table.md",
    } <= artifacts
    metrics = run_.data.metrics
    assert "model/all/airspace_opacity/auroc" in metrics and "model/all/airspace_opacity/auroc_ci_low" in metrics
    assert "model/all/aneurysm/auroc" not in metrics  # n/a is not logged as a number
    assert 0 < metrics["readers/majority/overall/label_kappa"] <= 1
    assert "model/all/micro/label_kappa" in metrics and not any("rating_kappa" in key for key in metrics)
    assert run_.data.params["layout"] == "readers" and run_.data.params["n_readers"] == "4"


def test_make_dicom_balance_prints_and_writes_the_chi_square_tables(tmp_path):
    write_release_folder(tmp_path / "release", n=12)  # manufacturer alternates exactly as the subset does
    make = ["make", "--no-print-directory", "-o", "setup", "-o", ".venv/.installed", "dicom-balance",
            f"DATA_ROOT={tmp_path / 'release'}", f"ARGS=--out {tmp_path / 'out'}"]  # fmt: skip
    done = subprocess.run(make, cwd=PROJECT_ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    summary = pd.read_csv(tmp_path / "out" / "acquisition_balance.csv").set_index("field")
    expected = chi2_contingency([[6, 0], [0, 6]], correction=False)
    assert summary.loc["Manufacturer", "chi2"] == pytest.approx(expected.statistic)
    assert summary.loc["Manufacturer", "p_value"] == pytest.approx(expected.pvalue)
    assert summary.loc["ManufacturerModelName", "categories"] == 1 and np.isnan(
        summary.loc["ManufacturerModelName", "p_value"]
    )
    per_study = pd.read_csv(tmp_path / "out" / "acquisition.csv", dtype=str)
    assert len(per_study) == 12 and set(per_study["ViewPosition"]) == {"PA", "AP"}  # the frontal file of each study
    assert "Manufacturer" in done.stdout and "12 studies by subset" in done.stdout
    bad = subprocess.run([*make, "BY=site"], cwd=PROJECT_ROOT, capture_output=True, text=True)
    assert bad.returncode != 0 and "make dicom-balance: no column 'site' in the study table" in bad.stderr
    assert "Traceback" not in bad.stderr


# --- the readers' rating kappa and the demographics ----------------------------------------------------------------


def test_a_bad_rating_is_one_named_error(tmp_path):
    write_release_folder(tmp_path, n=4, ratings=True)
    table = pd.read_csv(tmp_path / "labels.csv", dtype=str, keep_default_na=False)
    table.loc[2, "rating_2"] = "Agree somewhat"
    table.to_csv(tmp_path / "labels.csv", index=False)
    protocol = reveal(tmp_path, **{"release.ratings": list(RATERS)})
    with pytest.raises(BadInput, match=re.escape("labels.csv line 4, column rating_2: rating 'Agree somewhat' is not")):
        read_release(tmp_path, protocol.release, REVEAL_LABELS)


def rating_levels(table: pd.DataFrame, binary: bool) -> np.ndarray:
    """``(N, 3)`` each rater's level (-1: blank): 0/1/2 as rated, or 0/1/1 with Agree mostly merged with Disagree."""
    codes = {"agree all": 0, "agree mostly": 1, "disagree": 1 if binary else 2}
    return table[list(RATERS)].apply(lambda c: c.str.lower().map(codes)).fillna(-1).to_numpy(dtype=int)


def sk_majority_kappa(levels: np.ndarray, rows: np.ndarray | None = None) -> tuple[float, int, int]:
    """scikit-learn's kappa of every rating with its study's majority level (more than half of the study's raters),
    all raters pooled, on ``rows``; with the pairs scored and the ratings left out for want of a majority."""
    rows = np.ones(len(levels), bool) if rows is None else rows
    majority = []
    for r in levels:
        given = [v for v in r if v >= 0]
        top = max(set(given), key=given.count)
        majority.append(top if 2 * given.count(top) > len(given) else -1)
    reference = np.broadcast_to(np.array(majority)[:, None], levels.shape)
    keep = (levels >= 0) & (reference >= 0) & rows[:, None]
    ties = int(((levels >= 0) & (reference < 0) & rows[:, None]).sum())
    return float(cohen_kappa_score(levels[keep], reference[keep])), int(keep.sum()), ties


def swap_mostly_and_disagree(table: pd.DataFrame, columns: tuple[str, ...]) -> pd.DataFrame:
    swapped = table.copy()
    for column in columns:
        lower = swapped[column].str.lower()
        swapped[column] = np.select([lower == "agree mostly", lower == "disagree"], ["Disagree", "Agree mostly"],
                                    swapped[column])  # fmt: skip
    return swapped


def test_the_binary_rating_kappa_stands_beside_the_papers_and_ignores_a_mostly_disagree_swap(tmp_path):
    table = write_release_folder(tmp_path / "rated", n=12, ratings=True, demographics=True)
    write_release_folder(tmp_path / "swapped", n=12, ratings=True, demographics=True)
    swapped = swap_mostly_and_disagree(table, (RATERS[0], RATERS[2]))  # readers 1 and 3 swap the two answers
    swapped.to_csv(tmp_path / "swapped" / "labels.csv", index=False)
    assert (swapped[list(RATERS)] != table[list(RATERS)]).any().any()
    protocol = reveal(tmp_path, **{"release.ratings": list(RATERS)})
    clip = write_tiny_clip(tmp_path / "clip")
    seen = {}
    for name, frame in (("rated", table), ("swapped", swapped)):
        result = run(protocol, tmp_path / name, clip, n_boot=50)
        kappa = result.extras.tables["readers_rating_kappa"]
        pooled = kappa[(kappa["reference"] == "majority") & (kappa["reader"] == "all readers")]
        binary, three = (pooled[pooled["scale"] == s].set_index("finding") for s in ("binary", "three-level"))
        expected = {"binary": sk_majority_kappa(rating_levels(frame, binary=True)),
                    "three-level": sk_majority_kappa(rating_levels(frame, binary=False))}  # fmt: skip
        assert binary.loc["overall", "rating_kappa"] == pytest.approx(expected["binary"][0])
        assert three.loc["overall", "rating_kappa"] == pytest.approx(expected["three-level"][0])
        opacity = frame["airspace_opacity"].to_numpy() == 1  # per finding: the studies that carry it
        assert binary.loc["airspace opacity", "rating_kappa"] == pytest.approx(
            sk_majority_kappa(rating_levels(frame, binary=True), opacity)[0])  # fmt: skip
        metrics = result.extras.metrics
        assert metrics["readers/majority/overall/rating_kappa_binary"] == pytest.approx(expected["binary"][0])
        assert metrics["readers/majority/overall/rating_kappa_three_level"] == pytest.approx(expected["three-level"][0])
        assert metrics["readers/majority/overall/rating_kappa_binary_ci_low"] <= expected["binary"][0]
        assert not any(key.endswith("/label_kappa") for key in metrics)  # the release has no per-reader 0/1 reads
        report = "\n\n".join(result.extras.sections)
        assert (f"| binary (the paper's scale: Agree all vs Agree mostly or Disagree) | 12 | "
                f"{expected['binary'][0]:.3f} [") in report and "| 0.622 [0.590, 0.651] |" in report  # fmt: skip
        assert "| three-level (the platform's: Agree all / Agree mostly / Disagree as rated) | 12 | " in report
        assert "REVEAL-CXR's per-finding figures, from airspace opacity 0.484" in report
        seen[name] = (binary, three, expected)
    (binary, three, expected), (binary_swapped, three_swapped, _) = seen["rated"], seen["swapped"]
    pd.testing.assert_frame_equal(binary, binary_swapped)  # the paper's scale cannot see the swap...
    assert three.loc["overall", "rating_kappa"] != pytest.approx(three_swapped.loc["overall", "rating_kappa"], abs=1e-3)
    # Studies 4 and 10 have no three-level majority (3 ratings each); study 7's third reader rated nothing. On the
    # binary scale every study has a majority: three raters always split unevenly, and study 7's two agree.
    assert (three.loc["overall", "n"], three.loc["overall", "n_tie"], three.loc["overall", "n_blank"]) == (
        expected["three-level"][1], 6, 1) and expected["three-level"][1] == 36 - 6 - 1  # fmt: skip
    assert (binary.loc["overall", "n"], binary.loc["overall", "n_tie"]) == (35, 0) == expected["binary"][1:]
    assert "| F1 | Label kappa |" in protocol.report_table(result)  # the model's kappa is named a label kappa


def test_a_reader_table_says_why_it_has_no_rating_kappa(tmp_path):
    write_reader_folder(tmp_path / "data", n=8)
    result = run(reveal(), tmp_path / "data", write_tiny_clip(tmp_path / "clip"), n_boot=20)
    report = "\n\n".join(result.extras.sections)
    assert ("**Readers' rating kappa** (each reader's Agree all / Agree mostly / Disagree vs the majority rating): "
            "n/a (reads.csv holds each reader's 0/1 reads of the findings") in report  # fmt: skip
    assert "readers_rating_kappa" not in result.extras.tables
    assert not any("rating_kappa" in key for key in result.extras.metrics)
    assert any(key.endswith("/label_kappa") for key in result.extras.metrics)
    assert "REVEAL-CXR's per-finding kappas are label kappas of this kind" in report


def test_demographics_counts_equal_a_plain_pandas_count(tmp_path):
    table = write_release_folder(tmp_path, n=12, demographics=True)
    protocol = reveal()
    study = read_release(tmp_path, protocol.release, REVEAL_LABELS)
    frame = demographics(study.table, protocol.demographic_columns, protocol.demographic_numeric, "subset",
                         "labels.csv")  # fmt: skip
    got = frame.set_index(["characteristic", "level", "subset"])
    for name in ("sex", "race"):
        counts = pd.crosstab(table[name].replace("", "missing"), table["subset"])  # a blank cell: "missing"
        for level in counts.index:
            for subset in ("released", "holdout"):
                assert got.loc[(name, level, subset), "value"] == counts.loc[level, subset]
                share = 100 * counts.loc[level, subset] / (table["subset"] == subset).sum()
                assert got.loc[(name, level, subset), "percent"] == pytest.approx(share)
            assert got.loc[(name, level, "all"), "value"] == counts.loc[level].sum()
    assert got.loc[("race", "missing", "all"), "value"] == 3  # studies 3, 7, 11
    table["age"] = table["age"].astype(int)
    ages = table.groupby("subset")["age"].agg(["count", "mean", "std", "median", "min", "max"])
    for subset in ("released", "holdout"):
        for level, column in (("n", "count"), ("mean", "mean"), ("sd", "std"), ("median", "median"),
                              ("min", "min"), ("max", "max")):  # fmt: skip
            assert got.loc[("age", level, subset), "value"] == pytest.approx(ages.loc[subset, column])
        q1 = table.loc[table["subset"] == subset, "age"].quantile(0.25)
        assert got.loc[("age", "q1", subset), "value"] == pytest.approx(q1)
    assert got.loc[("age", "mean", "all"), "value"] == pytest.approx(table["age"].mean())
    absent = frame[frame["characteristic"] == "patient class"]
    assert absent[["level", "subset"]].values.tolist() == [["not in this release", "all"]]
    assert absent["note"].iloc[0] == "no column 'patient_class' in labels.csv"


def test_missing_demographic_columns_are_named_rows_not_an_error(tmp_path):
    write_reader_folder(tmp_path / "data", n=8)  # no age, sex, race or patient class anywhere
    result = run(reveal(), tmp_path / "data", write_tiny_clip(tmp_path / "clip"), n_boot=0)
    frame = result.extras.tables["demographics"]
    assert frame[["characteristic", "level", "subset"]].values.tolist() == [
        [name, "not in this release", "all"] for name in ("age", "sex", "race", "patient class")
    ]
    assert frame["note"].iloc[0] == "no column 'age' in reads.csv and adjudicated.csv"
    report = "\n\n".join(result.extras.sections)
    assert "| sex | not in this release |" in report and "Not in this release: age (no column 'age'" in report
    ages = pd.DataFrame({"age": ["71", ">89", ""], "subset": ["a", "b", "a"]})  # a censored age: counted by value
    counted = demographics(ages, {"age": "age", "sex": None}, ["age"], "subset")
    assert counted.set_index(["level", "subset"]).loc[(">89", "b"), "value"] == 1
    assert "not numeric everywhere (e.g. '>89')" in counted["note"].iloc[0]
    assert counted.iloc[-1][["characteristic", "level"]].tolist() == ["sex", "not in this release"]
    assert "null" in counted.iloc[-1]["note"]
