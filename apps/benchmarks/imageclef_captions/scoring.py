"""ImageCLEFmedical Caption 2024 (ROCOv2) caption prediction: caption files, the organisers' metrics, two floors.

The 2024 task reports ten caption metrics. Each is computed here with its reference implementation where a package
does it on this machine without a download, or is n/a with the reason (:data:`NOT_AVAILABLE`):

| metric | here |
|---|---|
| BERTScore (primary) | ``bert-score``, ``microsoft/deberta-xlarge-mnli`` at its registered layer (40), idf weights over the preprocessed references, F1; only when the weights are on this machine |
| ROUGE-1 F (secondary) | ``rouge-score``, its default tokenizer, no stemmer |
| BLEU-1 | ``nltk``'s ``sentence_bleu`` with weights ``(1,)``, one reference, whitespace tokens |
| METEOR | ``pycocoevalcap``'s METEOR 1.5 (the COCO caption evaluation's Java jar, ``-l en -norm``) |
| CIDEr | ``pycocoevalcap``'s CIDEr-D (n = 4, sigma = 6), document frequencies over the scored references |
| BLEURT, ClinicalBLEURT, MedBERTScore | n/a: model checkpoints, none on this machine or in a package |
| CLIPScore, RefCLIPScore | n/a: an image-text model's weights and the images |

Every reference and predicted caption goes through :func:`preprocess` before a metric sees it, then each metric is
computed per caption and averaged over the test images.

Source of the rules: the organisers' published evaluators, ``caption_prediction/evaluator.py`` of the 2025 code
(GitHub ``taubsity/clef-caption-evaluation``) and of the 2026 code (``taubsity/clef-caption-evaluation-2026``), read
for reference only; nothing here is copied from them. The 2024 task's own evaluator is not published; its metric
list is the 2024 overview's, and where the later evaluators still compute a metric (BERTScore, ROUGE) their settings
are matched:

- **BERTScore**: ``BERTScorer(model_type=microsoft/deberta-xlarge-mnli, idf=True, idf_sents=<every reference,
  preprocessed>)``, its F1 per caption (the 2026 evaluator; the 2025 one reported recall). Computed only when the
  weights are on this machine -- a local folder, or the Hugging Face cache (``HF_HUB_CACHE``, else
  ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``) -- and then loaded from that folder, so no network is ever
  used; otherwise the values are NaN and :attr:`CaptionScores.not_computed` says which model was asked for and
  where it was looked for. Another model is never scored under this one's name.
- **Empty captions**, the 2026 evaluator's rule on the *raw* strings: when both the reference and the prediction are
  empty strings (length 0, before any preprocessing) the caption scores 1 on every metric bounded by 1 (BERTScore,
  ROUGE-1, BLEU-1, METEOR); otherwise the metric is computed on the preprocessed pair, and a side that is empty
  after preprocessing (``"..."``) scores 0, as ``rouge-score`` and ``bert-score`` score an empty sentence. CIDEr has
  no such rule (its scale is not 0..1): it is what the implementation gives, 0 for an empty side.

Floors: :func:`constant_caption` (the most common training caption for every image) and :func:`nearest_caption`
(the caption of the most similar training image by embedding cosine).
"""

from __future__ import annotations

import csv
import gzip
import io
import math
import os
import re
import shutil
import string
import warnings
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from apps.benchmarks.framework.extra import require

BERTSCORE_MODEL = "microsoft/deberta-xlarge-mnli"
METRICS = ("bertscore", "rouge1", "bleu1", "meteor", "cider")
NOT_AVAILABLE = {
    "bleurt": "BLEURT needs its checkpoint weights (BLEURT-20), which no installed package ships",
    "clipscore": "CLIPScore needs the organisers' image-text model weights and the test images",
    "refclipscore": "RefCLIPScore needs the organisers' image-text model weights and the test images",
    "clinicalbleurt": "ClinicalBLEURT needs its clinically fine-tuned BLEURT checkpoint, which no package ships",
    "medbertscore": "MedBERTScore needs a medical BERT model's weights, which no installed package ships",
}
"""The task's other metrics, each n/a with the reason: every one needs model weights this machine does not have."""
ID_COLUMN, CAPTION_COLUMN = "ID", "Caption"
MAX_LISTED = 5  # ids listed per kind when a run and its references differ

# ---------------------------------------------------------------------------------------------------------------
# Preprocessing
# ---------------------------------------------------------------------------------------------------------------

_NUMBER = re.compile(r"\d+")
"""A run of digits, as the organisers' evaluator matches numbers (so ``3.5`` is ``number.number`` before step 3)."""
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def preprocess(text: str) -> str:
    """The organisers' caption normalisation, step for step as their evaluator does it:

    1. lower-case (``str.lower``);
    2. every run of digits -> ``number`` (``\\d+``: ``3.5`` -> ``number.number``, ``t2`` -> ``tnumber``);
    3. the characters of ``string.punctuation`` deleted, not replaced by a space (``x-ray`` -> ``xray``,
       ``number.number`` -> ``numbernumber``); other characters (unicode dashes and quotes, ``°``) stay.

    Whitespace is left as it is: ROUGE's tokenizer and BLEU-1's split both ignore runs of spaces. Reproducing their
    quirks exactly (a decimal becomes one ``numbernumber`` token) keeps our figures comparable to the published ones.
    """
    return _NUMBER.sub("number", text.lower()).translate(_PUNCTUATION)


# ---------------------------------------------------------------------------------------------------------------
# Caption files
# ---------------------------------------------------------------------------------------------------------------


class CaptionFileError(ValueError):
    """A caption table that cannot be scored; the message names the file and, where there is one, the line."""


class EmptyCaptionFile(CaptionFileError):
    """The file has no rows (no bytes, or a header only)."""


class MissingColumns(CaptionFileError):
    """The header lacks ``ID`` or ``Caption``."""


class MalformedRow(CaptionFileError):
    """A row that is not exactly an id and a caption (a caption with commas must be quoted)."""


class DuplicateId(CaptionFileError):
    """An image id given twice."""


def _open_text(path: Path) -> io.TextIOBase:
    with open(path, "rb") as handle:
        gzipped = handle.read(2) == b"\x1f\x8b"
    if gzipped:
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8-sig", newline="")
    return open(path, encoding="utf-8-sig", newline="")


def _rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    """``(line, fields)`` of each non-blank CSV row; ``line`` is the 1-based line where the row starts."""
    with _open_text(path) as handle:
        reader = csv.reader(handle)
        start = 1
        for fields in reader:
            if fields and any(f.strip() for f in fields):
                yield start, fields
            start = reader.line_num + 1


def read_captions(path: str | Path) -> dict[str, str]:
    """A caption table (``ID,Caption`` CSV with that header, plain or gzipped): image id -> caption, in file order.

    Columns are found by name (case and surrounding spaces ignored); other columns are ignored. Ids are stripped;
    captions are kept as written (an empty caption is allowed).

    Raises:
        EmptyCaptionFile: no header or no rows.
        MissingColumns: the header lacks ``ID`` or ``Caption``.
        MalformedRow: a row with fewer fields than the header needs, or an empty id.
        DuplicateId: an id given twice (both lines named).
    """
    path = Path(path)
    rows = _rows(path)
    first = next(rows, None)
    if first is None:
        raise EmptyCaptionFile(f"{path}: empty file (expected a header {ID_COLUMN},{CAPTION_COLUMN} and rows)")
    header_line, header = first
    names = [h.strip().lower() for h in header]
    missing = [c for c in (ID_COLUMN, CAPTION_COLUMN) if c.lower() not in names]
    if missing:
        raise MissingColumns(f"{path}: line {header_line}: header {header} lacks column(s) {', '.join(missing)} "
                             f"(expected {ID_COLUMN},{CAPTION_COLUMN})")  # fmt: skip
    id_at, caption_at = names.index(ID_COLUMN.lower()), names.index(CAPTION_COLUMN.lower())
    captions: dict[str, str] = {}
    lines: dict[str, int] = {}
    for line, fields in rows:
        if len(fields) <= max(id_at, caption_at):
            raise MalformedRow(f"{path}: line {line}: {len(fields)} field(s), expected {len(header)} ({fields})")
        image_id = fields[id_at].strip()
        if not image_id:
            raise MalformedRow(f"{path}: line {line}: empty {ID_COLUMN}")
        if image_id in captions:
            raise DuplicateId(f"{path}: line {line}: id {image_id!r} given again (first on line {lines[image_id]})")
        captions[image_id], lines[image_id] = fields[caption_at], line
    if not captions:
        raise EmptyCaptionFile(f"{path}: header only, no captions")
    return captions


# ---------------------------------------------------------------------------------------------------------------
# Lexical metrics
# ---------------------------------------------------------------------------------------------------------------


def both_empty(reference: str, candidate: str) -> bool:
    """The organisers' agreement rule: both *raw* strings are empty (length 0, nothing preprocessed or stripped)."""
    return len(reference) == 0 and len(candidate) == 0


@lru_cache(maxsize=1)
def _rouge():
    """The organisers' ROUGE-1 settings: ``rouge-score``'s default tokenizer (lower-case, ``[a-z0-9]+`` runs), no
    stemmer. After :func:`preprocess` it differs from a whitespace split only on non-ASCII letters, which it treats
    as separators (``naïve`` -> ``na``, ``ve``)."""
    return require("rouge_score.rouge_scorer").RougeScorer(["rouge1"], use_stemmer=False)


def rouge1_f(reference: str, candidate: str) -> float:
    """ROUGE-1 F-measure of ``candidate`` against one ``reference``, both put through :func:`preprocess` first.

    ``2 * P * R / (P + R)`` with ``P = overlap / candidate tokens`` and ``R = overlap / reference tokens``, where
    the overlap counts each word at most as often as the other side has it. Both raw strings empty: 1.0; otherwise
    ``rouge-score``'s value, 0.0 when either side has no token.
    """
    if both_empty(reference, candidate):
        return 1.0
    return float(_rouge().score(preprocess(reference), preprocess(candidate))["rouge1"].fmeasure)


def bleu1(reference: str, candidate: str) -> float:
    """Sentence-level BLEU-1 of ``candidate`` against one ``reference`` by ``nltk``'s ``sentence_bleu`` (weights
    ``(1,)``): ``BP * p1``, the clipped unigram precision times the brevity penalty ``exp(1 - r / c)`` when the
    candidate is shorter. Tokens are the whitespace-separated words of the preprocessed captions. Both raw strings
    empty: 1.0; either side without a token: 0.0 (no unigram can match).
    """
    if both_empty(reference, candidate):
        return 1.0
    ref_tokens, cand_tokens = preprocess(reference).split(), preprocess(candidate).split()
    if not ref_tokens or not cand_tokens:
        return 0.0
    sentence_bleu = require("nltk.translate.bleu_score").sentence_bleu
    with warnings.catch_warnings():  # nltk warns on a zero count; 0 is the value meant
        warnings.simplefilter("ignore")
        return float(sentence_bleu([ref_tokens], cand_tokens, weights=(1.0,)))


@lru_cache(maxsize=1)
def _meteor_jar(meteor_class):
    """One METEOR Java process for the whole session: starting it (loading its paraphrase tables) takes seconds.
    Its ``__del__`` ends it at exit."""
    return meteor_class()


def meteor(references: Sequence[str], candidates: Sequence[str]) -> tuple[np.ndarray | None, str]:
    """Per-caption METEOR by ``pycocoevalcap`` (METEOR 1.5, English, ``-norm``: the COCO caption evaluation's jar).

    ``(values, "")``, or ``(None, reason)`` when Java is missing. Pairs are preprocessed first; both
    raw strings empty score 1.0, a side without a token 0.0 (no match is possible; the jar is not asked).
    """
    values = np.zeros(len(references))
    asked = {}
    for i, (reference, candidate) in enumerate(zip(references, candidates, strict=True)):
        ref, cand = " ".join(preprocess(reference).split()), " ".join(preprocess(candidate).split())
        if both_empty(reference, candidate):
            values[i] = 1.0
        elif ref and cand:
            asked[i] = (ref, cand)
    if not asked:
        return values, ""
    if shutil.which("java") is None:
        return None, "METEOR 1.5 runs on Java, and no java is on PATH"
    jar, keys = _meteor_jar(require("pycocoevalcap.meteor.meteor").Meteor), list(asked)
    _, scores = jar.compute_score({k: [asked[k][0]] for k in keys}, {k: [asked[k][1]] for k in keys})
    values[keys] = np.asarray(scores, dtype=float)
    return values, ""


def cider(references: Sequence[str], candidates: Sequence[str]) -> tuple[np.ndarray | None, str]:
    """Per-caption CIDEr-D by ``pycocoevalcap`` (n = 4, sigma = 6), the document frequencies taken over all the
    ``references`` given (so a caption's value depends on the set it is scored in, as CIDEr defines it).

    ``(values, "")``. Captions are preprocessed and whitespace-tokenised.
    """
    if not references:
        return np.zeros(0), ""
    refs = {i: [" ".join(preprocess(r).split())] for i, r in enumerate(references)}
    cands = {i: [" ".join(preprocess(c).split())] for i, c in enumerate(candidates)}
    _, scores = require("pycocoevalcap.cider.cider").Cider().compute_score(refs, cands)
    return np.asarray(scores, dtype=float), ""


# ---------------------------------------------------------------------------------------------------------------
# BERTScore: local weights only
# ---------------------------------------------------------------------------------------------------------------

_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")  # fmt: skip
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache as the environment names it now: ``HF_HUB_CACHE`` (or the older
    ``HUGGINGFACE_HUB_CACHE``), else ``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub`` or
    ``~/.cache/huggingface/hub`` (read at each call, unlike ``huggingface_hub.constants``)."""
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(variable):
            return Path(os.environ[variable]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


def _complete(folder: Path) -> str:
    """Why ``folder`` cannot be loaded as a transformers model (no config or no weights), or ``""``."""
    lacking = []
    if not (folder / "config.json").is_file():
        lacking.append("config.json")
    if not any((folder / name).is_file() for name in _WEIGHT_FILES):
        lacking.append("weights (" + " / ".join(_WEIGHT_FILES) + ")")
    return f"{folder} lacks {' and '.join(lacking)}" if lacking else ""


def resolve_local_model(model: str) -> tuple[Path | None, str]:
    """Where ``model``'s files are on this machine, without any network: ``(folder, "")``, or ``(None, reason)``.

    ``model`` is a folder (used when it exists) or a hub repo id, looked up in :func:`hub_cache_dir` with
    ``huggingface_hub.snapshot_download(local_files_only=True)``. The reason names the model and where it looked.
    """
    folder = Path(model).expanduser()
    if folder.is_dir():
        problem = _complete(folder)
        return (None, f"{model}: {problem}") if problem else (folder, "")
    if not _REPO_ID.match(model):
        return None, f"{model}: no such folder, and not a Hugging Face repo id"
    cache = hub_cache_dir()
    try:
        from huggingface_hub import snapshot_download

        snapshot = Path(snapshot_download(model, cache_dir=cache, local_files_only=True))
    except Exception as error:  # LocalEntryNotFoundError when absent; anything else is named too
        return None, (f"{model}: weights not on this machine: not in the Hugging Face cache {cache} "
                      f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}) and no folder "
                      f"{folder}; no download is tried (copy the cache from a machine with access, e.g. after "
                      f"`hf download {model}`, or pass a local folder)")  # fmt: skip
    problem = _complete(snapshot)
    return (None, f"{model}: cached snapshot incomplete: {problem}") if problem else (snapshot, "")


def idf_weights(tokenizer, sentences: Sequence[str]) -> defaultdict:
    """``bert-score``'s idf weights over ``sentences`` (``get_idf_dict``: ``log((M + 1) / (df + 1))``, each token id
    counted once per sentence, ``log(M + 1)`` for an unseen one), with an empty sentence counted as ``bert-score``
    encodes it, its special tokens alone: ``bert-score``'s own encoder fails on an empty sentence with the installed
    transformers, and the organisers' idf corpus holds every reference, empty ones included."""
    sent_encode = require("bert_score.utils").sent_encode
    special = tokenizer.encode("", add_special_tokens=True)
    counts = Counter(i for s in sentences for i in set(sent_encode(tokenizer, s) if s.strip() else special))
    total = len(sentences)
    weights = defaultdict(lambda: math.log(total + 1))
    weights.update({i: math.log((total + 1) / (n + 1)) for i, n in counts.items()})
    return weights


def _bertscore_f1(refs: list[str], cands: list[str], idf_refs: list[str], model: str, num_layers: int | None,
                  idf: bool, device: str | None, batch_size: int) -> tuple[np.ndarray | None, str, Path | None, int | None]:  # fmt: skip
    """Per-pair F1 for non-empty preprocessed pairs: ``(values, "", folder, layers)`` or ``(None, reason, ...)``.

    ``idf_refs`` are the sentences the idf weights are counted over (every preprocessed reference, as the
    organisers pass them), not only the pairs scored here."""
    if num_layers is None:
        model2layers = require("bert_score.utils").model2layers
        if model not in model2layers:
            raise ValueError(f"bert-score registers no layer for {model!r}: pass bertscore_num_layers")
        num_layers = model2layers[model]
    folder, reason = resolve_local_model(model)
    if folder is None:
        return None, reason, None, num_layers
    if not cands:
        return np.zeros(0), "", folder, num_layers
    if "t5" in str(folder) and "t5" not in model:  # bert-score picks T5's encoder class for any such name
        return (
            None,
            f"{model}: its folder {folder} has 't5' in its path, which bert-score loads as T5",
            None,
            num_layers,
        )
    BERTScorer = require("bert_score").BERTScorer
    try:
        import torch

        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        # Loaded from the folder, never by name: transformers makes no hub request, whatever HF_HUB_OFFLINE says.
        scorer = BERTScorer(model_type=str(folder), num_layers=num_layers, lang="en", idf=idf, device=device,
                            batch_size=batch_size)  # fmt: skip
        if idf:
            scorer._idf_dict = idf_weights(scorer._tokenizer, idf_refs)  # what idf_sents=idf_refs would set
    except Exception as error:
        return None, f"{model}: loading {folder} failed: {type(error).__name__}: {error}", folder, num_layers
    _, _, f1 = scorer.score(cands, refs, batch_size=batch_size)
    return f1.detach().cpu().numpy().astype(float), "", folder, num_layers


# ---------------------------------------------------------------------------------------------------------------
# Scoring a run
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CaptionScores:
    """Per-caption scores of a run (in the references' order, for bootstrapping) and their means.

    Attributes:
        ids: the image ids, in the order of the arrays.
        per_caption: metric -> ``(N,)`` float array (:data:`METRICS` and :data:`NOT_AVAILABLE`); NaN where not
            computed.
        not_computed: metric -> why it was not computed (BERTScore without local weights, a metric needing weights
            no package ships, or not asked for).
        bertscore_model: the model asked for (``None``: BERTScore not asked for).
        bertscore_folder: the folder its weights were loaded from (``None`` when not computed).
        bertscore_layer: the layer whose embeddings were used.
    """

    ids: tuple[str, ...]
    per_caption: dict[str, np.ndarray]
    not_computed: dict[str, str] = field(default_factory=dict)
    bertscore_model: str | None = None
    bertscore_folder: str | None = None
    bertscore_layer: int | None = None

    @property
    def means(self) -> dict[str, float]:
        """Metric -> mean over the captions (NaN for a metric not computed)."""
        return {name: float(np.mean(values)) if name not in self.not_computed and len(values) else float("nan")
                for name, values in self.per_caption.items()}  # fmt: skip

    def summary(self) -> list[str]:
        """One line per metric: its mean over the captions, or why it is missing."""
        lines = []
        for name, mean in self.means.items():
            if name in self.not_computed:
                lines.append(f"{name}: not computed: {self.not_computed[name]}")
            else:
                extra = f" ({self.bertscore_model}, layer {self.bertscore_layer})" if name == "bertscore" else ""
                lines.append(f"{name}: {mean:.4f} over {len(self.ids)} captions{extra}")
        return lines


def caption_scores(references: Mapping[str, str], run: Mapping[str, str],
                   bertscore_model: str | None = BERTSCORE_MODEL, *, bertscore_num_layers: int | None = None,
                   bertscore_idf: bool = True, device: str | None = None, batch_size: int = 32,
                   lexical: bool = True) -> CaptionScores:  # fmt: skip
    """Scores ``run`` against ``references`` (both image id -> caption) with the task's metrics (module docstring).

    Args:
        references: the true captions; the scores follow its order.
        run: a caption for every reference id and no other.
        bertscore_model: a hub repo id or a local folder; ``None`` skips BERTScore. Weights are used only when on
            this machine (see :func:`resolve_local_model`); otherwise ``bertscore`` is NaN with the reason in
            ``not_computed``.
        bertscore_num_layers: the layer to use; ``None`` takes the one ``bert-score`` registers for a repo id
            (40 for ``microsoft/deberta-xlarge-mnli``); a local folder needs it given.
        bertscore_idf: weight tokens by idf counted over every preprocessed reference (the organisers' setting,
            the default); ``False`` weights tokens equally.
        device: ``cuda``/``cpu``; ``None`` uses CUDA when available.
        batch_size: BERTScore batch size.
        lexical: also METEOR and CIDEr (``pycocoevalcap``; METEOR starts a Java process); ``False`` leaves them
            n/a, for callers that only want BERTScore, ROUGE-1 and BLEU-1.

    Raises:
        ValueError: ``run``'s ids differ from ``references``'; a model without a registered layer and no
            ``bertscore_num_layers``.
    """
    ids = tuple(references)
    unknown = [i for i in run if i not in references]
    absent = [i for i in ids if i not in run]
    if unknown or absent:
        raise ValueError(f"run and references differ: {len(absent)} reference ids without a caption "
                         f"{absent[:MAX_LISTED]}, {len(unknown)} run ids not in the references {unknown[:MAX_LISTED]}")  # fmt: skip
    raw_refs, raw_cands = [references[i] for i in ids], [run[i] for i in ids]
    per_caption = {
        "rouge1": np.array([rouge1_f(r, c) for r, c in zip(raw_refs, raw_cands, strict=True)], dtype=float),
        "bleu1": np.array([bleu1(r, c) for r, c in zip(raw_refs, raw_cands, strict=True)], dtype=float),
    }
    not_computed: dict[str, str] = {}
    refs, cands = [preprocess(r) for r in raw_refs], [preprocess(c) for c in raw_cands]
    bert = np.full(len(ids), np.nan)
    folder = layer = None
    if bertscore_model is None:
        not_computed["bertscore"] = "not asked for (bertscore_model=None)"
    else:
        agree = np.array([both_empty(r, c) for r, c in zip(raw_refs, raw_cands, strict=True)], dtype=bool)
        blank = np.array([not r.split() or not c.split() for r, c in zip(refs, cands, strict=True)], dtype=bool)
        scored = ~agree & ~blank
        values, reason, folder, layer = _bertscore_f1(
            [r for r, keep in zip(refs, scored, strict=True) if keep],
            [c for c, keep in zip(cands, scored, strict=True) if keep],
            refs,
            bertscore_model,
            bertscore_num_layers,
            bertscore_idf,
            device,
            batch_size,
        )
        if values is None:
            not_computed["bertscore"] = reason
            folder = None
        else:  # an empty side scores 0, bert-score's value for an empty sentence (it cannot embed one here)
            bert[blank & ~agree], bert[agree], bert[scored] = 0.0, 1.0, values
    for name, metric in (("meteor", meteor), ("cider", cider)):
        values, reason = metric(raw_refs, raw_cands) if lexical else (None, "not asked for (lexical=False)")
        per_caption[name] = np.full(len(ids), np.nan) if values is None else values
        if values is None:
            not_computed[name] = reason
    for name, reason in NOT_AVAILABLE.items():
        per_caption[name] = np.full(len(ids), np.nan)
        not_computed[name] = reason
    ordered = {name: per_caption[name] for name in ("rouge1", "bleu1", "meteor", "cider", *NOT_AVAILABLE)}
    return CaptionScores(ids, {"bertscore": bert, **ordered}, not_computed, bertscore_model,
                         None if folder is None else str(folder), layer)  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# Floors
# ---------------------------------------------------------------------------------------------------------------


def constant_caption(train_captions: Sequence[str] | Mapping[str, str]) -> str:
    """The floor of one caption for every image: the most common training caption after :func:`preprocess`, in its
    preprocessed form (several raw captions may share it; scoring preprocesses anyway). Ties: the shortest (in
    characters), then the first in alphabetical order. Empty captions are not candidates.
    """
    texts = train_captions.values() if isinstance(train_captions, Mapping) else train_captions
    counts = Counter(p for p in (preprocess(t) for t in texts) if p)
    if not counts:
        raise ValueError("no non-empty training caption")
    return min(counts, key=lambda text: (-counts[text], len(text), text))


def _unit_rows(matrix: np.ndarray, name: str) -> np.ndarray:
    matrix = np.asarray(matrix, dtype=float)
    if matrix.ndim != 2:
        raise ValueError(f"{name}: expected a (rows, dims) array, got shape {matrix.shape}")
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    zero = np.flatnonzero(norms[:, 0] == 0)
    if len(zero):
        raise ValueError(f"{name}: row {zero[0]} is all zeros (no cosine similarity); {len(zero)} such rows")
    return matrix / norms


def nearest_caption(train_embeddings: np.ndarray, train_captions: Sequence[str], query_embeddings: np.ndarray,
                    k: int = 1) -> list[str]:  # fmt: skip
    """The retrieval floor: for each query image, the caption of the most similar training image by cosine.

    With ``k > 1`` the ``k`` nearest training images (``min(k, M)``) each propose their caption and the consensus
    caption is returned: the one with the highest mean ROUGE-1 F (:func:`rouge1_f`) against the other ``k - 1``
    proposals; ties go to the nearer image. Equal similarities rank the lower training index first. Captions are
    returned as written in ``train_captions``.

    Args:
        train_embeddings: ``(M, D)`` training image embeddings.
        train_captions: the ``M`` training captions, in the same order.
        query_embeddings: ``(N, D)`` query image embeddings.
        k: number of neighbours.
    """
    train = _unit_rows(train_embeddings, "train_embeddings")
    query = _unit_rows(query_embeddings, "query_embeddings")
    if len(train_captions) != len(train):
        raise ValueError(f"{len(train_captions)} training captions for {len(train)} training embeddings")
    if train.shape[1] != query.shape[1]:
        raise ValueError(f"embedding sizes differ: train {train.shape[1]}, query {query.shape[1]}")
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    k = min(k, len(train))
    similarity = query @ train.T  # (N, M)
    order = np.argsort(-similarity, axis=1, kind="stable")[:, :k]  # (N, k), nearest first
    out = []
    for neighbours in order:
        proposals = [train_captions[j] for j in neighbours]
        if k == 1:
            out.append(proposals[0])
            continue
        agreement = [
            np.mean([rouge1_f(other, proposal) for b, other in enumerate(proposals) if b != a])
            for a, proposal in enumerate(proposals)
        ]
        out.append(proposals[int(np.argmax(agreement))])  # argmax keeps the first (nearest) of equal means
    return out
