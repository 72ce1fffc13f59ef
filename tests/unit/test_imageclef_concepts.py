"""ImageCLEFmedical concept detection: hand-computed F1s, the empty-truth rules, run-file errors, the 2026 submission
check and the run writer."""

from __future__ import annotations

import gzip
import math
import warnings

import numpy as np
import pytest
from sklearn.metrics import f1_score

from apps.benchmarks.imageclef_concepts.scoring import (
    MANUAL_2024,
    MANUAL_2025,
    MAX_CONCEPTS,
    ConceptFileError,
    SubmissionCheckError,
    check_submission,
    empty_rows,
    frequency_prior,
    image_f1,
    manual_vocabulary,
    per_image_f1,
    read_concepts,
    read_run,
    secondary_vocabulary,
    write_run,
)
from apps.score import mean_with_interval

A, B, C, D, E = "C0000001", "C0000002", "C0000003", "C0000004", "C0000005"
IDS = ["img1", "img2", "img3"]


def write(path, text: str):
    path.write_text(text)
    return path


def mean_f1(truth, run, allowed=None) -> float:
    """The challenge score as ``make score`` reports it: the mean of the defined per-image F1 values."""
    return mean_with_interval(per_image_f1(truth, run, allowed)[1], n_boot=0)[0]


def evaluator_f1(true, predicted) -> float:
    """The organisers' computation, independently: sklearn binary F1 over the sorted union of both sets."""
    union = sorted(set(true) | set(predicted))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # precision is ill-defined for an empty prediction; sklearn scores 0
        return float(f1_score([int(c in true) for c in union], [int(c in predicted) for c in union], average="binary"))


# ------------------------------------------------------------------------------------------------ the F1 itself


def test_partial_overlap():
    # T = {A, B, C}, P = {A, B, D, E}: tp = 2, fp = 2, fn = 1 -> F1 = 2*2 / (2*2 + 2 + 1) = 4/7
    assert image_f1({A, B, C}, {A, B, D, E}) == pytest.approx(4 / 7)
    # precision 2/4, recall 2/3 -> 2 * (1/2 * 2/3) / (1/2 + 2/3) = (2/3) / (7/6) = 4/7 as well
    assert image_f1({A, B, C}, {A, B, D, E}) == pytest.approx(2 * (0.5 * 2 / 3) / (0.5 + 2 / 3))
    assert image_f1({A}, {A}) == 1.0
    assert image_f1({A}, {B}) == 0.0  # tp = 0


def test_empty_prediction_scores_zero_and_the_two_empty_truth_rules():
    assert image_f1({A, B}, set()) == 0.0  # tp = 0 against a non-empty truth
    assert math.isnan(image_f1(set(), {A}))  # secondary rule: an empty (filtered) truth is not scored
    assert math.isnan(image_f1(set(), set()))
    # primary rule: the evaluator reads an empty cell as the one concept "": {""} vs {""} -> F1 1, vs {A} -> 0
    assert image_f1(set(), set(), empty_truth="cell") == evaluator_f1({""}, {""}) == 1.0
    assert image_f1(set(), {A}, empty_truth="cell") == evaluator_f1({""}, {A}) == 0.0
    with pytest.raises(ValueError, match="skip or cell"):
        image_f1(set(), set(), empty_truth="drop")


def test_an_empty_primary_truth_cell_is_not_left_out():
    truth = {"x": {A, B}, "y": set(), "z": {C}, "w": set()}
    run = {"x": [A], "y": [A, B], "z": [C, D], "w": []}
    # x: tp 1, |T| 2, |P| 1 -> 2/3;  z: tp 1, |T| 1, |P| 2 -> 2/3;  y: empty truth, concepts predicted -> 0;
    # w: empty truth, empty prediction -> 1.  Mean over all four: (2/3 + 0 + 2/3 + 1) / 4 = 7/12
    ids, values = per_image_f1(truth, run)
    assert ids == ("x", "y", "z", "w")
    np.testing.assert_allclose(values, [2 / 3, 0.0, 2 / 3, 1.0])
    assert mean_f1(truth, run) == pytest.approx(7 / 12)


def test_an_empty_secondary_truth_leaves_the_mean():
    truth = {"x": {A, B}, "y": set(), "z": {C}}
    run = {"x": [A], "y": [A, B], "z": [C, D]}
    # allowed {A, B, C}: x -> 2/3; z: T {C}, P {C} -> 1; y: empty filtered truth, left out -> mean (2/3 + 1) / 2
    _, values = per_image_f1(truth, run, allowed={A, B, C})
    assert values[0] == pytest.approx(2 / 3) and math.isnan(values[1]) and values[2] == 1.0
    assert mean_f1(truth, run, {A, B, C}) == pytest.approx(5 / 6)


def test_every_secondary_truth_empty_is_nan_not_a_zero_division():
    assert math.isnan(mean_f1({"x": set(), "y": frozenset()}, {"x": [A], "y": []}, allowed={A}))
    # the truth is non-empty but nothing of it is allowed
    assert math.isnan(mean_f1({"x": {A}}, {"x": [A]}, allowed={B}))


def test_the_named_secondary_vocabularies():
    # 2024: 6 modalities + 8 X-ray body regions; 2025 adds optical coherence tomography and nothing else
    assert len(MANUAL_2024) == 14 and {"C0920367"} == MANUAL_2025 - MANUAL_2024 and MANUAL_2024 < MANUAL_2025
    assert secondary_vocabulary("2024") == MANUAL_2024
    assert not MANUAL_2025 & {"C1999039", "C1996865", "C0205129"}  # no projection (AP, PA, sagittal) is scored
    with pytest.raises(ValueError, match="no secondary vocabulary '2023'.*known: 2024, 2025"):
        secondary_vocabulary("2023")


def test_case_and_spaces_do_not_matter():
    # run "c0000001" vs truth "C0000001" -> one hit; |T| 1, |P| 2 -> 2/3
    assert mean_f1({"x": {A}}, {"x": [" c0000001 ", "c0000002"]}) == pytest.approx(2 / 3)
    assert mean_f1({"x": {A.lower()}}, {"x": [A]}) == 1.0


def test_secondary_filter():
    allowed = {A, B}
    truth = {"x": {A, D}, "y": {D}, "z": {A, B}}
    run = {"x": [A, E], "y": [A], "z": [B]}
    # primary: x tp 1 |T| 2 |P| 2 -> 1/2;  y tp 0 -> 0;  z tp 1 |T| 2 |P| 1 -> 2/3;  mean (1/2 + 0 + 2/3)/3 = 7/18
    assert mean_f1(truth, run) == pytest.approx(7 / 18)
    # secondary: x -> T {A}, P {A} (E is outside the allowed set: it does not count against the prediction) -> 1
    #            y -> T {} after filtering: left out;  z -> T {A, B}, P {B} -> 2/3;  mean (1 + 2/3)/2 = 5/6
    ids, values = per_image_f1(truth, run, allowed)
    assert values[0] == 1.0 and math.isnan(values[1]) and values[2] == pytest.approx(2 / 3)
    assert mean_f1(truth, run, allowed) == pytest.approx(5 / 6)
    assert mean_f1(truth, run, {a.lower() for a in allowed}) == pytest.approx(5 / 6)  # allowed set's case too


def test_equals_sklearn_per_image_on_random_sets():
    rng = np.random.default_rng(0)
    vocabulary = [f"C{n:07d}" for n in range(12)]
    truth, run = {}, {}
    for i in range(400):
        true = set(rng.choice(vocabulary, rng.integers(0, 6), replace=False))
        predicted = set(rng.choice(vocabulary, rng.integers(0, 8), replace=False))
        truth[f"i{i}"], run[f"i{i}"] = true, sorted(predicted)
        if true:
            assert image_f1(true, predicted) == pytest.approx(evaluator_f1(true, predicted), abs=1e-12)
    # the evaluator's primary mean: every image, an empty cell read as the one concept "" (truth and ID, run lines)
    cell = lambda concepts: set(concepts) or {""}  # noqa: E731
    assert sum(not t for t in truth.values()) > 0 and any(not truth[i] and not run[i] for i in truth)
    scored = [evaluator_f1(cell(truth[i]), cell(run[i])) for i in truth]
    assert mean_f1(truth, run) == pytest.approx(sum(scored) / len(scored), abs=1e-12)
    allowed = set(vocabulary[:5])
    kept = [(truth[i] & allowed, set(run[i]) & allowed) for i in truth]
    scored = [evaluator_f1(t, p) for t, p in kept if t]
    assert mean_f1(truth, run, allowed) == pytest.approx(sum(scored) / len(scored), abs=1e-12)


def test_run_must_match_the_truth_ids():
    with pytest.raises(ValueError, match="misses 1 of the 2"):
        mean_f1({"x": {A}, "y": {B}}, {"x": [A]})
    with pytest.raises(ValueError, match="not in the truth"):
        mean_f1({"x": {A}}, {"x": [A], "q": [B]})
    with pytest.raises(ValueError, match="truth is empty"):
        mean_f1({}, {})


# ------------------------------------------------------------------------------------------------ ground truth


def test_read_concepts_plain_and_gzip(tmp_path):
    text = f"ID,CUIs\nimg1,{A};{B.lower()}\nimg2,\nimg3,{C}\n"
    plain = read_concepts(write(tmp_path / "gt.csv", text))
    assert plain == {"img1": frozenset({A, B}), "img2": frozenset(), "img3": frozenset({C})}
    assert list(plain) == IDS
    with gzip.open(tmp_path / "gt.csv.gz", "wt") as handle:
        handle.write(text)
    assert read_concepts(tmp_path / "gt.csv.gz") == plain
    assert read_concepts(write(tmp_path / "noheader.csv", f"img1,{A}\n")) == {"img1": frozenset({A})}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (f"ID,CUIs\nimg1,{A}\nimg2,C12345\n", r"gt\.csv, line 3: malformed CUI 'C12345' for 'img2'"),
        (f"ID,CUIs\nimg1,{A};\n", r"line 2: malformed CUI ''"),
        (f"ID,CUIs\nimg1,{A};X0000001\n", r"line 2: malformed CUI 'X0000001'"),
        (f"ID,CUIs\nimg1,{A}\nimg2,{B}\nimg1,{C}\n", r"line 4: image id 'img1' given twice \(first on line 2\)"),
        ("", r"gt\.csv: no rows"),
        ("ID,CUIs\n", r"gt\.csv: no rows"),
        (f"ID,CUIs\nimg1\nimg2,{A}\n", r"line 2: expected 2 fields"),
        (f"ID,CUIs\nimg1,{A},{B}\n", r"line 2: expected 2 fields"),
        (f"ID,CUIs\n,{A}\n", r"line 2: empty image id"),
    ],
)
def test_ground_truth_errors(tmp_path, text, message):
    with pytest.raises(ConceptFileError, match=message):
        read_concepts(write(tmp_path / "gt.csv", text))


# ------------------------------------------------------------------------------------------------ run files


def test_read_run_rules_that_pass(tmp_path):
    text = f"ID,CUIs\nimg2, {B.lower()} ;{A}\nimg1\nimg3,\n"  # header, spaces, lower case, id alone, empty cell
    run = read_run(write(tmp_path / "run.csv", text), IDS)
    assert run == {"img2": (B, A), "img1": (), "img3": ()}
    assert read_run(write(tmp_path / "bare.csv", f"img1,{A}\nimg2,{A}\nimg3,{A}\n"), iter(IDS))["img3"] == (A,)
    # the evaluator does not check that a predicted concept is a CUI: anything else is just a false positive
    assert read_run(write(tmp_path / "odd.csv", "img1,foo\nimg2\nimg3\n"), IDS)["img1"] == ("FOO",)
    many = ";".join(f"C{n:07d}" for n in range(MAX_CONCEPTS))
    assert len(read_run(write(tmp_path / "max.csv", f"img1,{many}\nimg2\nimg3\n"), IDS)["img1"]) == MAX_CONCEPTS


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (f"img1,{A}\nimg9,{A}\nimg3\n", r"run\.csv, line 2: image id 'img9' is not in the test set"),
        (f"ID,CUIs\nimg1,{A}\nimg2\nimg1,{B}\n", r"line 4: image id 'img1' given twice \(first on line 2\)"),
        (f"img1,{A};{B};{A}\nimg2\nimg3\n", rf"line 1: concept '{A}' given more than once for 'img1'"),
        (f"img1,{A};{A.lower()}\nimg2\nimg3\n", rf"line 1: concept '{A}' given more than once"),
        (
            "img1,{}\nimg2\nimg3\n".format(";".join(f"C{n:07d}" for n in range(101))),
            r"line 1: 101 concepts.*at most 100",
        ),
        (f"img1,{A}\nimg3,{B}\n", r"run\.csv: the run has 2 of the 3 test images; 1 missing \('img2'\)"),
        (f"img1,{A},{B}\nimg2\nimg3\n", r"line 1: 3 fields"),
        (f"img1,{A};;{B}\nimg2\nimg3\n", r"line 1: empty concept"),
        (f"img1,{A};\nimg2\nimg3\n", r"line 1: empty concept"),
        (f"img1,{A}\n\nimg2\nimg3\n", r"line 2: blank line"),
        ("", r"the run has 0 of the 3 test images"),
    ],
)
def test_run_errors(tmp_path, text, message):
    with pytest.raises(ConceptFileError, match=message):
        read_run(write(tmp_path / "run.csv", text), IDS)


def test_run_line_numbers_count_physical_lines(tmp_path):
    # a header and a quoted cell: the error on the 4th line of the file says line 4
    text = f'ID,CUIs\nimg1,"{A};{B}"\nimg2\nimg2\n'
    with pytest.raises(ConceptFileError, match="line 4: image id 'img2' given twice"):
        read_run(write(tmp_path / "run.csv", text), IDS)


# ------------------------------------------------------------------------------------------------ writing


def test_write_run_round_trip(tmp_path):
    predictions = {"img3": [C], "img1": [B, f" {A.lower()} ", B, A], "img2": []}
    path = tmp_path / "run.csv"
    back = write_run(path, predictions, IDS)
    # the 2026 format: header, test-id order; de-duplicated keeping first occurrence, upper-cased; empty -> "id,"
    assert path.read_text() == f"ID,CUIs\nimg1,{B};{A}\nimg2,\nimg3,{C}\n"
    check_submission(path, IDS)
    assert back == read_run(path, IDS) == {"img1": (B, A), "img2": (), "img3": (C,)}
    assert empty_rows(back) == ["img2"]
    assert [p.name for p in tmp_path.iterdir()] == ["run.csv"]  # no temporary left
    write_run(path, predictions, IDS, header=False)  # the bare 2025-style file: read the same, refused by the check
    assert path.read_text() == f"img1,{B};{A}\nimg2\nimg3,{C}\n" and read_run(path, IDS) == back
    with pytest.raises(SubmissionCheckError, match="'header'"):
        check_submission(path, IDS)
    gz = tmp_path / "run.csv.gz"
    write_run(gz, predictions, IDS)
    assert gz.read_bytes()[:2] == b"\x1f\x8b" and read_run(gz, IDS) == back
    truth = {"img1": {A, B}, "img2": {C}, "img3": {C}}
    assert mean_f1(truth, back) == pytest.approx((1 + 0 + 1) / 3)


GOOD = f"ID,CUIs\nimg1,{A};{B}\nimg2,\nimg3,C123\n"  # an empty cell and a short CUI are both allowed


@pytest.mark.parametrize(
    ("text", "rule", "line"),
    [
        ("\ufeff" + GOOD, "encoding", 1),
        (f"img1,{A}\nimg2,\nimg3,{C}\n", "header", 1),  # no header: the write_run default of before
        (GOOD.replace("ID,CUIs", "id,cuis"), "header", 1),
        (GOOD.replace("ID,CUIs", "ID,CUIs,x"), "header", 1),
        (GOOD + "\n", "blank line", 5),
        (GOOD.replace("img2,\n", "img2,\n\n"), "blank line", 4),
        (GOOD.replace("img2,", "img2"), "fields", 3),
        (GOOD.replace("img2,", f"img2,{A},{B}"), "fields", 3),
        (GOOD.replace("img2,", f"img2, {A}"), "whitespace", 3),
        (GOOD.replace("img2,", f" img2,{A}"), "whitespace", 3),
        (GOOD.replace("img3,C123", "img1,C123"), "duplicate id", 4),
        (GOOD.replace("img3", "img9"), "unknown id", 4),
        (f"ID,CUIs\nimg1,{A}\nimg2,\n", "missing ids", None),
        (f"ID,CUIs\nimg2,\nimg1,{A}\nimg3,{C}\n", "order", 2),
        (GOOD.replace("img2,", f"img2,{A};"), "empty CUI", 3),
        (GOOD.replace("img2,", f"img2,{A};;{B}"), "empty CUI", 3),
        (GOOD.replace("img2,", f"img2,{A.lower()}"), "CUI format", 3),
        (GOOD.replace("img2,", "img2,C12a"), "CUI format", 3),
        (GOOD.replace("img2,", f"img2,{A};{B};{A}"), "duplicate CUI", 3),
    ],
)
def test_the_2026_submission_check_names_the_broken_rule(tmp_path, text, rule, line):
    path = tmp_path / "submission.csv"
    path.write_bytes(text.encode("utf-8"))
    with pytest.raises(SubmissionCheckError, match=f"submission check '{rule}' failed") as caught:
        check_submission(path, IDS)
    assert caught.value.rule == rule
    assert (f"line {line}:" in str(caught.value)) if line else ", line" not in str(caught.value)


def test_the_2026_submission_check_passes_the_stated_format(tmp_path):
    path = tmp_path / "submission.csv"
    path.write_text(GOOD)
    check_submission(path, IDS)  # raises on any broken rule (each one above)
    path.write_bytes(GOOD.encode("latin-1").replace(b"img1", b"img\xe91"))
    with pytest.raises(SubmissionCheckError, match="'encoding'"):
        check_submission(path, IDS)


@pytest.mark.parametrize(
    ("predictions", "message"),
    [
        ({"img1": [A], "img2": [A]}, "1 test ids have no prediction"),
        ({"img1": [A], "img2": [A], "img3": [A], "img9": [A]}, "not test ids"),
        ({"img1": ["foo"], "img2": [], "img3": []}, "'FOO' is not a CUI"),
        ({"img1": [f"C{n:07d}" for n in range(101)], "img2": [], "img3": []}, "101 concepts"),
    ],
)
def test_write_run_refuses_before_writing(tmp_path, predictions, message):
    path = tmp_path / "run.csv"
    with pytest.raises(ValueError, match=message):
        write_run(path, predictions, IDS)
    assert not any(tmp_path.iterdir())
    with pytest.raises(ValueError, match="repeats"):
        write_run(path, {"img1": [A]}, ["img1", "img1"])


# ------------------------------------------------------------------------------------------------ baselines


def test_frequency_prior_and_manual_vocabulary():
    train = {"a": {A, B}, "b": {A, C}, "c": {A, B, D}, "d": {C, B}, "e": {E}}
    # counts: A 3, B 3, C 2, D 1, E 1; sizes 2 2 3 2 1 -> median 2; ties broken by CUI (A before B)
    assert frequency_prior(train) == (A, B)
    assert frequency_prior(train, k=3) == (A, B, C)
    assert frequency_prior(train, k=0) == ()
    assert frequency_prior(train, k=10) == (A, B, C, D, E)
    # sizes 1 and 2: median 1.5 rounds half up to 2
    assert frequency_prior({"a": {A}, "b": {A, B}}) == (A, B)
    assert manual_vocabulary({"a": {A, B}, "b": frozenset(), "c": {b.lower() for b in [C]}}) == {A, B, C}
    assert len(MANUAL_2025) == 15 and all(len(cui) == 8 and cui.startswith("C") for cui in MANUAL_2025)
    assert len(MANUAL_2024) == 14
