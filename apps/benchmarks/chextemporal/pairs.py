"""Prior/current image pairs with a progression label per finding: the tables of a CheXTemporal-style benchmark.

A pair's answers are only meaningful when the two films really are the same patient's, in the right order, and
the label speaks the benchmark's vocabulary; a table that breaks any of this scores a model on nonsense without
any error. So every pair table, whatever its source (a release manifest, NIH follow-ups, covid-chestxray
follow-ups; docs/benchmarks.md, "CheXTemporal progression"), passes :func:`validate_pairs`, which refuses it with
a :class:`DataContractError` naming the file, line, column and value. Ids (pairs, patients) are text
throughout: a patient ``0042`` or ``313a`` must never become a number.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.model_selection import StratifiedGroupKFold

from apps.benchmarks.framework.tables import (
    DataContractError,
    as_text,
    cell,
    first_bad,
    line_of,
    match_vocabulary,
    parse_numbers,
    read_text_csv,
    require_columns,
    where,
)
from training.data import splits
from training.data.label_names import canonical_name, normalise
from training.data.manifest import parse_labels

#: CheXTemporal's five progression classes of a finding from the prior to the current film.
PROGRESSION: tuple[str, ...] = ("new", "worse", "stable", "improved", "resolved")
#: What presence/absence labels (NIH follow-ups) can tell: absent -> present, present -> absent, present in both.
#: ``persisting`` covers worse, stable and improved, which need a size or severity that such labels do not carry.
COARSE: tuple[str, ...] = ("new", "persisting", "resolved")

#: One row per (pair of films, finding). ``path`` is the current film, ``prior_path`` the earlier one, both relative
#: to the data root; ``progression`` empty = unlabelled; ``days_between`` empty when the source has no dates.
PAIR_COLUMNS: tuple[str, ...] = (
    "pair_id", "patient_id", "prior_path", "path", "finding", "progression", "days_between", "source", "split",
)  # fmt: skip
#: Columns a pair table cannot do without; the others default to empty.
REQUIRED_PAIR_COLUMNS: tuple[str, ...] = ("pair_id", "patient_id", "prior_path", "path", "finding")
#: Optional columns a reader fills when it knows them, checked when present.
TIME_COLUMNS: tuple[str, str] = ("prior_time", "current_time")
PATIENT_COLUMNS: tuple[str, str] = ("prior_patient_id", "current_patient_id")


def parse_times(source: str, table: pd.DataFrame, column: str) -> pd.Series:
    """A time column as numbers (days, offsets) when every filled cell is one, else as dates; empty = unknown."""
    text = as_text(table[column])
    filled = text != ""
    numbers = pd.to_numeric(text.where(filled, None), errors="coerce")
    if not (filled & numbers.isna()).any():
        return numbers.astype(float)
    dates = pd.to_datetime(text.where(filled, None), errors="coerce", format="mixed")
    first_bad(source, table, (filled & dates.isna()).to_numpy(), column,
              "{value} is neither a number (days) nor a date")  # fmt: skip
    return dates


def validate_pairs(
    table: pd.DataFrame,
    root: Path | None,
    findings: Sequence[str],
    classes: Sequence[str],
    source_file: str = "pairs",
) -> pd.DataFrame:
    """The pair table in canonical form, or the first broken row as a :class:`DataContractError`.

    Refused: an empty id or path, a film paired with itself, a duplicated ``pair_id``, a prior film later than the
    current one, two films of different patients, a finding outside ``findings`` (matched case-, space- and
    alias-insensitively, returned in the vocabulary's spelling), a progression outside ``classes`` (empty =
    unlabelled is allowed), and, when ``root`` is given, a film that is not a file under it (``root=None`` skips
    the disk, for tables derived before the images are at hand). :data:`PAIR_COLUMNS` come first in the copy
    returned (``days_between`` float, NaN = unknown); other columns are kept after them.
    """
    source = str(source_file)
    require_columns(source, table, REQUIRED_PAIR_COLUMNS)
    out = table.copy()
    for column in PAIR_COLUMNS:
        out[column] = as_text(out[column]) if column in out.columns else pd.Series("", index=out.index, dtype=object)
    for column in ("pair_id", "patient_id", "prior_path", "path", "finding"):
        first_bad(source, out, (out[column] == "").to_numpy(), column, "empty cell ({value}); it is required")
    first_bad(source, out, (out["prior_path"] == out["path"]).to_numpy(), "path",
              "{value} is both the prior and the current film of the pair")  # fmt: skip
    duplicated = out["pair_id"].duplicated(keep=False).to_numpy()
    if duplicated.any():
        positions = np.flatnonzero(out["pair_id"] == out["pair_id"].iloc[int(np.flatnonzero(duplicated)[0])])
        raise DataContractError(f"{source} lines {', '.join(str(line_of(out, p)) for p in positions[:6])}, column "
                                f"pair_id: {out['pair_id'].iloc[positions[0]]!r} names more than one pair "
                                f"({int(duplicated.sum())} rows share an id)")  # fmt: skip

    days = parse_numbers(source, out, "days_between")
    first_bad(source, out, days < 0, "days_between",
              "{value}: the prior film is later than the current one (prior and current swapped?)")  # fmt: skip
    out["days_between"] = days
    if all(c in out.columns for c in TIME_COLUMNS):
        prior, current = (parse_times(source, out, c) for c in TIME_COLUMNS)
        if pd.api.types.is_datetime64_any_dtype(prior) != pd.api.types.is_datetime64_any_dtype(current):
            raise DataContractError(f"{source}: {TIME_COLUMNS[0]} and {TIME_COLUMNS[1]} must both be numbers (days) "
                                    f"or both dates")  # fmt: skip
        later = (prior > current).fillna(False).to_numpy(dtype=bool)
        if later.any():
            position = int(np.flatnonzero(later)[0])
            raise DataContractError(f"{where(source, out, position, TIME_COLUMNS[1])}: {cell(out, TIME_COLUMNS[1], position)!r} "
                                    f"is before the prior film's {TIME_COLUMNS[0]} {cell(out, TIME_COLUMNS[0], position)!r}: "
                                    f"the prior film is later than the current one")  # fmt: skip
    if all(c in out.columns for c in PATIENT_COLUMNS):
        prior_patient, current_patient = (as_text(out[c]) for c in PATIENT_COLUMNS)
        differ = ((prior_patient != "") & (current_patient != "") & (prior_patient != current_patient)).to_numpy()
        if differ.any():
            position = int(np.flatnonzero(differ)[0])
            raise DataContractError(f"{where(source, out, position, PATIENT_COLUMNS[1])}: {current_patient.iloc[position]!r} "
                                    f"is not the prior film's patient {prior_patient.iloc[position]!r}: a pair must be "
                                    f"two films of one patient")  # fmt: skip

    out["finding"] = match_vocabulary(source, out, "finding", findings, "finding")
    by_key = {normalise(name): name for name in classes}
    progression = out["progression"].map(lambda v: "" if v == "" else by_key.get(normalise(v)))
    first_bad(source, out, progression.isna().to_numpy(), "progression",
              f"{{value}} is not a progression class of this benchmark ({', '.join(classes)}; empty = unlabelled)")  # fmt: skip
    out["progression"] = progression.astype(object)

    if root is not None:
        root = Path(root)
        for column in ("prior_path", "path"):
            present = {p: (root / p).is_file() for p in out[column].unique()}
            first_bad(source, out, ~out[column].map(present).to_numpy(dtype=bool), column,
                      f"{{value}}: image file not found under {root}")  # fmt: skip
    return out[list(PAIR_COLUMNS) + [c for c in out.columns if c not in PAIR_COLUMNS]]


def read_pair_manifest(path: Path, root: Path | None, findings: Sequence[str], classes: Sequence[str]) -> pd.DataFrame:
    """A generic pair manifest (a CSV with :data:`PAIR_COLUMNS`, every cell read as text), validated.

    The CheXTemporal release reader maps the release's own column names onto :data:`PAIR_COLUMNS` and ends here.
    """
    return validate_pairs(read_text_csv(Path(path)), root, findings, classes, source_file=str(path))


def pick_column(table: pd.DataFrame, names: Sequence[str]) -> str | None:
    return next((name for name in names if name in table.columns), None)


def nih_followup_pairs(
    labels: pd.DataFrame,
    findings: Sequence[str],
    source: str = "nih",
    source_file: str | None = None,
    columns: Mapping[str, Sequence[str]] | None = None,
) -> pd.DataFrame:
    """Pairs of consecutive films of each patient, labelled :data:`COARSE` per finding from NIH's per-film labels.

    The labels are mined from each film's report, so a finding the second report does not repeat reads as
    resolved: coarse, noisy labels for development, not a reference; absent in both gives no row. The order must
    be ``Data_Entry_2017_v2020``'s ``Follow-up #``: the 2017 numbering (the file-name suffix) is not chronological,
    which :func:`check_chronology` catches when there is an age column. NIH has no dates, so ``days_between`` is
    empty; views are kept for a caller that wants same-view pairs. ``columns`` maps a finding to the NIH names that
    answer it (``Lung Lesion``: ``Mass``, ``Nodule``); ``pair_id`` is ``<prior file>__<current file>__<finding>``.
    """
    name = source_file or f"{source} labels"
    path_column = pick_column(labels, ("path", "image", "Image Index"))
    patient_column = pick_column(labels, ("patient_id", "Patient ID"))
    follow_column = pick_column(labels, ("follow_up", "Follow-up #"))
    view_column = pick_column(labels, ("view", "View Position"))
    age_column = pick_column(labels, ("age", "Patient Age"))
    for column, wanted in ((path_column, "path/image/Image Index"), (patient_column, "patient_id/Patient ID"),
                           (follow_column, "follow_up/Follow-up #")):  # fmt: skip
        if column is None:
            require_columns(name, labels, [wanted])
    table = labels.copy()
    paths = as_text(table[path_column])
    if path_column == "Image Index":
        paths = "images/" + paths
    patients = as_text(table[patient_column])
    for column, values in ((path_column, paths), (patient_column, patients)):
        first_bad(name, table, (values == "").to_numpy(), column, "empty cell ({value}); it is required")
    follow = parse_numbers(name, table, follow_column)
    first_bad(name, table, np.isnan(follow) | (follow != np.round(follow)), follow_column,
              "{value} is not a follow-up number (a whole number)")  # fmt: skip
    key = pd.DataFrame({"patient": patients.to_numpy(), "follow": follow})
    repeated = key.duplicated(keep=False).to_numpy()
    if repeated.any():
        first = int(np.flatnonzero(repeated)[0])
        positions = np.flatnonzero((key["patient"] == key["patient"][first]) & (key["follow"] == key["follow"][first]))
        raise DataContractError(f"{name} lines {', '.join(str(line_of(table, p)) for p in positions[:6])}, column "
                                f"{follow_column}: patient {patients.iloc[positions[0]]!r} has follow-up "
                                f"{int(follow[positions[0]])} more than once, so the films cannot be ordered")  # fmt: skip

    list_column = pick_column(table, ("finding_labels", "Finding Labels"))
    presence = {finding: finding_presence(name, table, finding, (columns or {}).get(finding, (finding,)), list_column)
                for finding in findings}  # fmt: skip

    views = as_text(table[view_column]) if view_column else pd.Series("", index=table.index, dtype=object)
    order = pd.DataFrame({"patient": patients.to_numpy(), "follow": follow, "row": np.arange(len(table))})
    width = int(order["patient"].str.len().max()) if len(order) else 0
    order["sort_key"] = order["patient"].str.zfill(width)  # digit ids in numeric order, any ids deterministically
    order = order.sort_values(["sort_key", "patient", "follow"], kind="stable")
    if age_column is not None:
        check_chronology(name, table, order, parse_numbers(name, table, age_column), follow_column, age_column)
    rows = []
    for _, films in order.groupby("patient", sort=False):
        index = films["row"].to_numpy()
        for a, b in zip(index[:-1], index[1:], strict=True):
            for finding in findings:
                before, after = presence[finding][a], presence[finding][b]
                if np.isnan(before) or np.isnan(after) or (before == 0 and after == 0):
                    continue
                progression = "persisting" if before and after else ("new" if after else "resolved")
                rows.append({
                    "pair_id": f"{Path(paths.iloc[a]).name}__{Path(paths.iloc[b]).name}__{finding}",
                    "patient_id": patients.iloc[b], "prior_path": paths.iloc[a], "path": paths.iloc[b],
                    "finding": finding, "progression": progression, "days_between": "", "source": source,
                    "split": "", "prior_follow_up": int(follow[a]), "follow_up": int(follow[b]),
                    "prior_view": views.iloc[a], "view": views.iloc[b],
                })  # fmt: skip
    pairs = pd.DataFrame(rows, columns=[*PAIR_COLUMNS, "prior_follow_up", "follow_up", "prior_view", "view"])
    return validate_pairs(pairs, None, findings, COARSE, source_file=f"pairs derived from {name}")


def finding_presence(
    name: str, table: pd.DataFrame, finding: str, answers: Sequence[str], list_column: str | None
) -> np.ndarray:
    """Per film 1/0/NaN: is any of ``answers`` present (its 0/1 column, or else the ``|``-separated list column)?

    A film is positive when any answering column is 1, negative when none is 1 and one is 0, and NaN (unknown)
    when all are blank.
    """

    def answers_to(label: str) -> bool:
        return any(canonical_name(label, [answer]) == answer for answer in answers)

    matched = [c for c in table.columns if c != list_column and answers_to(str(c))]
    if matched:
        stacked = []
        for column in matched:
            values, bad = parse_labels(as_text(table[column]))
            if len(bad):
                position = table.index.get_loc(bad[0])
                raise DataContractError(f"{where(name, table, position, column)}: {cell(table, column, position)!r} "
                                        f"is not 0/1 or empty ({len(bad)} such cell(s))")  # fmt: skip
            stacked.append(values)
        values = np.vstack(stacked)
        known = ~np.isnan(values)
        return np.where(known.any(axis=0), np.nan_to_num(values).max(axis=0), np.nan)
    if list_column is not None:
        lists = as_text(table[list_column]).str.split("|")
        return np.array([float(any(answers_to(item.strip()) for item in items)) for items in lists])
    raise DataContractError(f"{name}: no column for finding {finding!r} (looked for {', '.join(answers)}; and no "
                            f"Finding Labels list column); columns: {', '.join(map(str, table.columns))}")  # fmt: skip


def check_chronology(
    name: str, table: pd.DataFrame, order: pd.DataFrame, ages: np.ndarray, follow_column: str, age_column: str
) -> None:
    """Refuse follow-up numbers that are not in time order: a patient younger at a later follow-up.

    NIH renumbered follow-ups in ``Data_Entry_2017_v2020``; the 2017 numbering, which the file-name suffix keeps,
    is not chronological, and a table carrying it would silently swap prior and current films.
    """
    rows = order["row"].to_numpy()
    same_patient = order["patient"].to_numpy()[1:] == order["patient"].to_numpy()[:-1]
    before, after = ages[rows[:-1]], ages[rows[1:]]
    younger = same_patient & (after < before)  # NaN (no age) compares False: unknown, not a contradiction
    if younger.any():
        k = int(np.flatnonzero(younger)[0])
        a, b = rows[k], rows[k + 1]
        raise DataContractError(
            f"{where(name, table, b, follow_column)}: patient {order['patient'].iloc[k + 1]!r} at follow-up "
            f"{cell(table, follow_column, b)!r} is aged {ages[b]:g} ({age_column}), younger than at follow-up "
            f"{cell(table, follow_column, a)!r} on line "
            f"{line_of(table, a)} aged {ages[a]:g}: the follow-up numbers are not in time order "
            f"({int(younger.sum())} such step(s)); use Data_Entry_2017_v2020's Follow-up # (the 2017 numbering "
            f"and the file-name suffix are not chronological)"
        )


COVID_SCORES: tuple[str, ...] = ("opacity", "geographic_extent")


def covid_pairs(
    root: Path, threshold: float = 0.5, score: str = "opacity", finding: str = "Lung Opacity"
) -> pd.DataFrame:
    """The covid-temporal follow-up pairs, labelled worse / stable / improved from the raters' severity scores.

    The label is the change of the chosen mean severity score from the prior to the current film: above
    ``threshold`` = worse, below ``-threshold`` = improved, otherwise stable (exactly the threshold is stable). The
    difference is rounded to 6 decimals first, so that 7.3 - 6.8 lands on the boundary instead of a hair above it.
    Pairs lacking either score stay unlabelled. Severity says nothing about new or resolved opacity, so those
    classes never occur here.
    """
    if score not in COVID_SCORES:
        raise ValueError(f"score must be one of {', '.join(COVID_SCORES)}, got {score!r}")
    if not threshold >= 0:
        raise ValueError(f"threshold must be a number >= 0, got {threshold!r}")
    root = Path(root)
    path = root / "pairs.csv"
    table = read_text_csv(path)
    prior_score, current_score = f"prior_{score}_mean", f"current_{score}_mean"
    require_columns(str(path), table, ["patient_id", "prior_file", "current_file", prior_score, current_score])
    before = parse_numbers(str(path), table, prior_score)
    after = parse_numbers(str(path), table, current_score)
    diff = np.round(after - before, 6)
    progression = np.where(diff > threshold, "worse", np.where(diff < -threshold, "improved", "stable"))
    progression = np.where(np.isnan(diff), "", progression)

    def optional(column: str) -> pd.Series:
        return as_text(table[column]) if column in table.columns else pd.Series("", index=table.index, dtype=object)

    prior_files, current_files = as_text(table["prior_file"]), as_text(table["current_file"])
    pairs = pd.DataFrame({
        "pair_id": [f"{Path(a).name}__{Path(b).name}__{finding}" for a, b in zip(prior_files, current_files, strict=True)],
        "patient_id": as_text(table["patient_id"]), "prior_path": prior_files, "path": current_files,
        "finding": finding, "progression": progression, "days_between": optional("days_between"),
        "source": "covid-temporal", "split": "", "prior_view": optional("prior_view"), "view": optional("current_view"),
        "prior_score": before, "current_score": after, "score_diff": diff,
        "prior_time": optional("prior_offset"), "current_time": optional("current_offset"),
    }, index=table.index)  # fmt: skip
    return validate_pairs(pairs, root, [finding], PROGRESSION, source_file=str(path))


def patient_split(pairs: pd.DataFrame, fractions: Mapping[str, float], seed: int) -> pd.DataFrame:
    """A copy with ``split`` filled so that all pairs of a patient land in one split.

    A patient's split comes from a hash of the seed and the patient (:func:`training.data.splits.patient_split`),
    so adding pairs never moves a patient (which would leak). A patient is ``(source, patient_id)`` when a
    ``source`` is filled: the same id in two releases is two people.
    """
    out = pairs.copy()
    if out.empty:
        out["split"] = pd.Series(dtype=object)
        return out
    out["split"] = splits.patient_split(patient_keys(out), dict(fractions), seed)
    return out


def patient_keys(pairs: pd.DataFrame) -> list[str]:
    """Per pair, who the patient is: ``<source>:<patient_id>`` when a ``source`` is filled (the same id in two
    releases is two people), else the id."""
    sources = as_text(pairs["source"]) if "source" in pairs.columns else pd.Series("", index=pairs.index, dtype=object)
    return [f"{s}:{p}" if s else p for s, p in zip(sources, as_text(pairs["patient_id"]), strict=True)]


def patient_folds(pairs: pd.DataFrame, n_folds: int, seed: int) -> np.ndarray:
    """``(N,)`` cross-validation fold ``0 .. K-1`` of each labelled pair: every pair of a patient in one fold, and
    the progression classes spread over the folds as evenly as whole patients allow.

    sklearn's ``StratifiedGroupKFold`` on the pairs in ``pair_id`` order, so the folds do not depend on row order;
    leave-one-patient-out when there are fewer patients than ``n_folds``. Stratified, because a fold without a
    class would leave its fit unable to predict that class for reasons of chance alone.
    """
    if n_folds < 2:
        raise ValueError(f"cross-validation needs at least 2 folds, got {n_folds}")
    labels = as_text(pairs["progression"])
    if (labels == "").any():
        raise ValueError(f"{int((labels == '').sum())} pairs have no progression label; folds are for labelled pairs")
    keys = np.asarray(patient_keys(pairs))
    patients = len(set(keys.tolist()))
    if patients < 2:
        raise ValueError(f"cross-validation needs pairs of at least 2 patients, got {patients}")
    order = np.argsort(as_text(pairs["pair_id"]).to_numpy(), kind="stable")
    folds = np.empty(len(pairs), dtype=int)
    splitter = StratifiedGroupKFold(n_splits=min(int(n_folds), patients), shuffle=True, random_state=seed)
    with warnings.catch_warnings():  # "the least populated class has only n members": the folds still partition
        warnings.filterwarnings("ignore", message="The least populated class", category=UserWarning)
        for fold, (_, test) in enumerate(splitter.split(order, labels.to_numpy()[order], keys[order])):
            folds[order[test]] = fold
    return np.unique(folds, return_inverse=True)[1]
