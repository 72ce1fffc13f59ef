"""ImageCLEFmedical Caption 2024 (ROCOv2) caption prediction: caption files, the organisers' metrics, two floors.

Scoring (the organisers' rules, with the differences listed below): every reference and predicted caption goes
through :func:`preprocess`, then each metric is computed per caption and averaged over the test images:

- BERTScore F1 with ``microsoft/deberta-xlarge-mnli`` (primary), through the ``bert-score`` package at the layer
  it registers for that model (40), no idf weighting and no baseline rescaling by default. It is computed only when
  the weights are on this machine -- a local folder, or the Hugging Face cache (``HF_HUB_CACHE``, else
  ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``) -- and then loaded from that folder, so no network is ever
  used. Otherwise the per-caption values are NaN and :attr:`CaptionScores.not_computed` says which model was asked
  for and where it was looked for. Another model is never scored under this one's name: the model actually loaded
  is recorded in :attr:`CaptionScores.bertscore_model` / ``bertscore_folder``.
- ROUGE-1 F-measure (secondary), through ``rouge-score`` with the organisers' settings: its default tokenizer (which
  keeps ``[a-z0-9]`` runs only) and no stemmer.
- BLEU-1 (also reported by the organisers in earlier years): clipped unigram precision times the brevity penalty,
  one reference, per caption; tokens are the whitespace-separated words of the preprocessed caption.

Empty captions (after preprocessing): both empty scores 1.0 (as the organisers' evaluator does); exactly one empty
scores 0.0, for every metric (``bert-score`` itself cannot embed an empty sentence with the installed transformers).

Differences from the organisers' evaluators (2025: ``evaluate``'s rouge and bertscore per caption; 2026:
``BERTScorer``): their number pattern is ``\\d+``, so ``3.5`` becomes ``number.number`` and, once the dot is
removed, the single token ``numbernumber``; here a decimal is one ``number``. They remove ``string.punctuation``
only; here unicode punctuation (``’``, ``–``, ``“``) goes too. Their 2026 BERTScore weights tokens by idf over the
preprocessed references (``bertscore_idf=True`` here) and the 2025 one reported recall; here F1 without idf is the
default, as the 2024 task description states.

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
import string
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

BERTSCORE_MODEL = "microsoft/deberta-xlarge-mnli"
METRICS = ("bertscore", "rouge1", "bleu1")
ID_COLUMN, CAPTION_COLUMN = "ID", "Caption"
MAX_LISTED = 5  # ids listed in a missing-ids message before summarising

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
    """A caption table or run file that cannot be scored; the message names the file and, where there is one, the
    line."""


class EmptyCaptionFile(CaptionFileError):
    """The file has no rows (no bytes, or a header only)."""


class MissingColumns(CaptionFileError):
    """The header lacks ``ID`` or ``Caption``."""


class MalformedRow(CaptionFileError):
    """A row that is not exactly an id and a caption (a caption with commas must be quoted)."""


class DuplicateId(CaptionFileError):
    """An image id given twice."""


class UnknownId(CaptionFileError):
    """A run's image id that is not a test image."""


class MissingIds(CaptionFileError):
    """Test images the run gives no caption for."""


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


def read_caption_run(path: str | Path, test_ids: Sequence[str] | Mapping[str, str]) -> dict[str, str]:
    """A submitted run: ``<image id>,<caption>`` per line, one line for every test image, with or without an
    ``ID,Caption`` header (recognised by its first field being ``ID``, any case). Returns id -> caption.

    Args:
        path: the run file (plain or gzipped CSV; a caption containing a comma or a quote must be quoted).
        test_ids: the test images (a reference mapping's keys will do).

    Raises:
        EmptyCaptionFile: no rows.
        MalformedRow: a line that is not exactly two fields, or an empty id.
        UnknownId: an id that is not a test image (with its line).
        DuplicateId: an id given twice (with both lines).
        MissingIds: test images without a caption (how many, the first few ids, the number of lines read).
    """
    path = Path(path)
    expected = set(test_ids)
    run: dict[str, str] = {}
    lines: dict[str, int] = {}
    last = 0
    for number, (line, fields) in enumerate(_rows(path)):
        last = line
        if number == 0 and fields[0].strip().lower() == ID_COLUMN.lower():
            continue  # the header
        if len(fields) != 2:
            raise MalformedRow(f"{path}: line {line}: {len(fields)} field(s), expected 2 (<image id>,<caption>; "
                               f"quote a caption that contains a comma): {fields}")  # fmt: skip
        image_id = fields[0].strip()
        if not image_id:
            raise MalformedRow(f"{path}: line {line}: empty image id")
        if image_id not in expected:
            raise UnknownId(f"{path}: line {line}: image id {image_id!r} is not a test image")
        if image_id in run:
            raise DuplicateId(f"{path}: line {line}: image id {image_id!r} given again (first on line "
                              f"{lines[image_id]})")  # fmt: skip
        run[image_id], lines[image_id] = fields[1], line
    if not run:
        raise EmptyCaptionFile(f"{path}: no captions")
    absent = [i for i in test_ids if i not in run]
    if absent:
        listed = ", ".join(absent[:MAX_LISTED]) + (f" and {len(absent) - MAX_LISTED} more" if len(absent) > MAX_LISTED else "")  # fmt: skip
        raise MissingIds(f"{path}: {len(absent)} of {len(expected)} test images have no caption (file ends at line "
                         f"{last}): {listed}")  # fmt: skip
    return run


# ---------------------------------------------------------------------------------------------------------------
# Lexical metrics
# ---------------------------------------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _rouge():
    """The organisers' ROUGE-1 settings: ``rouge-score``'s default tokenizer (lower-case, ``[a-z0-9]+`` runs), no
    stemmer. After :func:`preprocess` it differs from a whitespace split only on non-ASCII letters, which it treats
    as separators (``naïve`` -> ``na``, ``ve``)."""
    from rouge_score import rouge_scorer, tokenizers

    tokenizer = tokenizers.DefaultTokenizer(use_stemmer=False)
    return rouge_scorer.RougeScorer(["rouge1"], use_stemmer=False, tokenizer=tokenizer), tokenizer


def rouge1_f(reference: str, candidate: str) -> float:
    """ROUGE-1 F-measure of ``candidate`` against one ``reference``, both put through :func:`preprocess` first.

    ``2 * P * R / (P + R)`` with ``P = overlap / candidate tokens`` and ``R = overlap / reference tokens``, where
    the overlap counts each word at most as often as the other side has it. Both token lists empty: 1.0; one empty:
    0.0.
    """
    scorer, tokenizer = _rouge()
    reference, candidate = preprocess(reference), preprocess(candidate)
    ref_tokens, cand_tokens = tokenizer.tokenize(reference), tokenizer.tokenize(candidate)
    if not ref_tokens and not cand_tokens:
        return 1.0
    if not ref_tokens or not cand_tokens:
        return 0.0
    return float(scorer.score(reference, candidate)["rouge1"].fmeasure)


def bleu1(reference: str, candidate: str) -> float:
    """Sentence-level BLEU-1 of ``candidate`` against one ``reference``, both put through :func:`preprocess` and
    split on whitespace: ``BP * p1`` where ``p1 = clipped matches / c`` (a candidate word counts at most as often as
    the reference has it), ``BP = 1`` if ``c > r`` else ``exp(1 - r / c)``, ``c`` and ``r`` the token counts. No
    smoothing (none is needed for unigrams). Both empty: 1.0; one empty: 0.0.
    """
    ref_tokens, cand_tokens = preprocess(reference).split(), preprocess(candidate).split()
    if not ref_tokens and not cand_tokens:
        return 1.0
    if not ref_tokens or not cand_tokens:
        return 0.0
    ref_counts = Counter(ref_tokens)
    matches = sum(min(n, ref_counts[w]) for w, n in Counter(cand_tokens).items())
    c, r = len(cand_tokens), len(ref_tokens)
    brevity = 1.0 if c > r else math.exp(1.0 - r / c)
    return brevity * matches / c


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


def _bertscore_f1(refs: list[str], cands: list[str], model: str, num_layers: int | None, idf: bool,
                  device: str | None, batch_size: int) -> tuple[np.ndarray | None, str, Path | None, int | None]:  # fmt: skip
    """Per-pair F1 for non-empty preprocessed pairs: ``(values, "", folder, layers)`` or ``(None, reason, ...)``."""
    if num_layers is None:
        from bert_score.utils import model2layers

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
    try:
        import torch
        from bert_score import BERTScorer

        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        # Loaded from the folder, never by name: transformers makes no hub request, whatever HF_HUB_OFFLINE says.
        scorer = BERTScorer(model_type=str(folder), num_layers=num_layers, lang="en", idf=idf,
                            idf_sents=refs if idf else None, device=device, batch_size=batch_size)  # fmt: skip
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
        per_caption: metric -> ``(N,)`` float array (``bertscore``, ``rouge1``, ``bleu1``); NaN where not computed.
        not_computed: metric -> why it was not computed (BERTScore without local weights, or not asked for).
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
                   bertscore_idf: bool = False, device: str | None = None, batch_size: int = 32) -> CaptionScores:  # fmt: skip
    """Scores ``run`` against ``references`` (both image id -> caption) after :func:`preprocess`.

    Args:
        references: the true captions; the scores follow its order.
        run: a caption for every reference id and no other (as :func:`read_caption_run` guarantees).
        bertscore_model: a hub repo id or a local folder; ``None`` skips BERTScore. Weights are used only when on
            this machine (see :func:`resolve_local_model`); otherwise ``bertscore`` is NaN with the reason in
            ``not_computed``.
        bertscore_num_layers: the layer to use; ``None`` takes the one ``bert-score`` registers for a repo id
            (40 for ``microsoft/deberta-xlarge-mnli``); a local folder needs it given.
        bertscore_idf: weight tokens by idf over the preprocessed references (the organisers' 2026 evaluator).
        device: ``cuda``/``cpu``; ``None`` uses CUDA when available.
        batch_size: BERTScore batch size.

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
    refs = [preprocess(references[i]) for i in ids]
    cands = [preprocess(run[i]) for i in ids]
    per_caption = {
        "rouge1": np.array([rouge1_f(r, c) for r, c in zip(refs, cands, strict=True)], dtype=float),
        "bleu1": np.array([bleu1(r, c) for r, c in zip(refs, cands, strict=True)], dtype=float),
    }
    not_computed: dict[str, str] = {}
    bert = np.full(len(ids), np.nan)
    folder = layer = None
    if bertscore_model is None:
        not_computed["bertscore"] = "not asked for (bertscore_model=None)"
    else:
        both_empty = np.array([not r and not c for r, c in zip(refs, cands, strict=True)])
        one_empty = np.array([bool(r) != bool(c) for r, c in zip(refs, cands, strict=True)])
        scored = ~(both_empty | one_empty)
        values, reason, folder, layer = _bertscore_f1(
            [r for r, keep in zip(refs, scored, strict=True) if keep],
            [c for c, keep in zip(cands, scored, strict=True) if keep],
            bertscore_model,
            bertscore_num_layers,
            bertscore_idf,
            device,
            batch_size,
        )
        if values is None:
            not_computed["bertscore"] = reason
            folder = None
        else:
            bert[both_empty], bert[one_empty], bert[scored] = 1.0, 0.0, values
    return CaptionScores(ids, {"bertscore": bert, **per_caption}, not_computed, bertscore_model,
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
