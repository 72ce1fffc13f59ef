"""The REVEAL-CXR protocol on the NIH expert relabelling (../shared/data/nih-expert: 61 images, three of 11
radiologists each), and on a DICOM copy of some of its images, which must score exactly as the PNGs; its
demographics (age and sex only) and why it has no rating kappa."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import cohen_kappa_score

from apps.benchmarks.framework.catalog import load_protocol
from apps.benchmarks.framework.protocol import Extras
from apps.benchmarks.framework.runner import draw_subsets, load_model, run_benchmark
from apps.benchmarks.reveal.agreement import majority
from tests.benchmark_data import write_tiny_clip
from tests.conftest import shared_data
from tests.reveal_data import dicom_copy

pytestmark = pytest.mark.realdata
PROTOCOL = load_protocol("reveal")


def test_the_stand_in_reads_as_published():
    root = shared_data("nih-expert")
    draw = draw_subsets(PROTOCOL, root)
    truth = draw.test.targets
    assert len(draw.test) == 61 and len(truth.readers) == 11
    assert truth.names == ("airspace opacity", "lung mass", "lung nodule", "pneumothorax")
    assert ((truth.reader_labels != -1).any(axis=2).sum(axis=1) == 3).all()  # three readers per image
    blanks = PROTOCOL.study.blanks.groupby("label")["blank"].sum()
    assert blanks.to_dict() == {"airspace opacity": 0, "lung mass": 3, "lung nodule": 3, "pneumothorax": 1}  # hedges
    reads = pd.read_csv(root / "reads.csv", dtype=str, keep_default_na=False)
    assert reads["reader_id"].nunique() == 11 and set(truth.readers) == set(reads["reader_id"])  # ids stay text
    # the majority equals a count of the published reads, image by image
    opacity = reads.assign(v=reads["airspace_opacity"].astype(int)).groupby("image")["v"].sum()
    np.testing.assert_array_equal(truth.labels[:, 0], (opacity.loc[draw.test.table["study_id"]] >= 2).astype(int))
    np.testing.assert_array_equal(truth.labels, majority(truth.reader_labels))
    adjudicated = pd.read_csv(root / "adjudicated.csv").set_index("image").loc[draw.test.table["study_id"]]
    agree = (truth.labels[:, 0] == adjudicated["airspace_opacity"].to_numpy()).mean()
    assert 0.85 < agree < 1.0  # the majority and the adjudication mostly agree, not always


def test_readers_pooled_kappa_equals_scikit_learn_on_the_real_reads():
    root = shared_data("nih-expert")
    draw = draw_subsets(PROTOCOL, root)
    truth = draw.test.targets
    from apps.benchmarks.reveal.agreement import reader_agreement

    table = reader_agreement(truth.reader_labels, truth.readers, truth.names, None)
    row = table[
        (table["reference"] == "majority") & (table["reader"] == "all readers") & (table["finding"] == "overall")
    ]
    reads = truth.reader_labels  # (N, R, K)
    reference = np.broadcast_to(truth.labels[:, None, :], reads.shape)
    keep = (reads != -1) & (reference != -1)
    assert row["n"].iloc[0] == keep.sum()
    assert row["kappa"].iloc[0] == pytest.approx(cohen_kappa_score(reads[keep], reference[keep]))


def test_a_dicom_copy_of_real_images_scores_exactly_as_the_pngs(tmp_path):
    source = shared_data("nih-expert")
    reads = pd.read_csv(source / "reads.csv", dtype=str, keep_default_na=False)
    chosen = sorted(reads["image"].unique())[:16]  # includes 00001369_000, stored as RGBA in the release
    png = tmp_path / "png"
    (png / "images").mkdir(parents=True)
    for rel in chosen:
        (png / rel).symlink_to(source / rel)
    reads[reads["image"].isin(chosen)].to_csv(png / "reads.csv", index=False)
    adjudicated = pd.read_csv(source / "adjudicated.csv", dtype=str, keep_default_na=False)
    adjudicated[adjudicated["image"].isin(chosen)].to_csv(png / "adjudicated.csv", index=False)
    dicom_copy(png, tmp_path / "dcm")  # alternately MONOCHROME2 and MONOCHROME1, identity window
    spec = write_tiny_clip(tmp_path / "clip")
    results = []
    for root in (png, tmp_path / "dcm"):
        draw = draw_subsets(PROTOCOL, root)
        model = load_model(PROTOCOL, spec, "sqlite:///unused.db")
        results.append(run_benchmark(PROTOCOL, draw, model, root, n_boot=100, cache_dir=None))
    assert results[1].draw.test.table["path"].str.endswith(".dcm").all()
    pd.testing.assert_frame_equal(results[0].table, results[1].table)
    png_scores, dcm_scores = (r.scores.drop(columns="study_id") for r in results)  # ids differ by extension only
    pd.testing.assert_frame_equal(png_scores, dcm_scores)
    assert results[0].table["value"].notna().sum() > 20


def test_the_stand_in_has_age_and_sex_but_no_ratings_race_or_patient_class():
    root = shared_data("nih-expert")
    draw = draw_subsets(PROTOCOL, root)
    study = PROTOCOL.study
    extras = Extras()
    rating = PROTOCOL.rating_section(study, draw.test.targets, np.empty((0, len(draw.test)), int), extras)
    assert study.ratings is None and "n/a (reads.csv holds each reader's 0/1 reads of the findings" in rating
    assert not extras.tables and not extras.metrics  # nothing to log: the NIH readers rated no suggested labels
    PROTOCOL.demographics_section(study, extras)
    frame = extras.tables["demographics"].set_index(["characteristic", "level", "subset"])
    adjudicated = pd.read_csv(root / "adjudicated.csv")
    for sex, count in adjudicated["sex"].value_counts().items():
        assert frame.loc[("sex", sex, "all"), "value"] == count
    assert frame.loc[("age", "n", "all"), "value"] == adjudicated["age"].notna().sum() == 61
    assert frame.loc[("age", "mean", "all"), "value"] == pytest.approx(adjudicated["age"].mean())
    assert frame.loc[("age", "median", "all"), "value"] == pytest.approx(adjudicated["age"].median())
    for name, column in (("race", "race"), ("patient class", "patient_class")):
        note = frame.loc[(name, "not in this release", "all"), "note"]
        assert note == f"no column '{column}' in reads.csv and adjudicated.csv"
