"""A model card across benchmarks: one table that sets a model's headline result on every benchmark it can take,
each beside its floor, next to the model's own CXR-LT test results (docs/benchmarks.md, "Model card").

The benchmarks run unchanged through the shared runner, so a card row equals what ``make benchmark`` logs. A row
is a result, ``n/a`` (the model cannot take the method) or ``not run``, each with its reason; a result under any
of its floors is flagged in every rendering, and a CXR-LT row keeps its run's caveats. The rows the run's task is
ranked on come first (:mod:`evaluation.headline`). Values read back from a run are untrusted: non-finite numbers
show as ``n/a`` and text is escaped for markdown and HTML (a renderer would take ``<`` / ``>`` for HTML and drop
them).
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from apps.benchmarks.framework.catalog import CONFIG_DIR, load_protocol
from apps.benchmarks.framework.encoders import Encoder
from apps.benchmarks.framework.protocol import BadInput, Protocol
from evaluation.headline import DEFAULT as DEFAULT_HEADLINE
from evaluation.headline import Headline
from evaluation.intervals import CI_RULE, left_out_note
from training.config_files import config_file

DEFAULT_CARD = config_file("card.yaml")
COLUMNS = ["benchmark", "protocol", "method", "metric", "value", "ci_low", "ci_high", "floor", "below_floor", "status",
           "note"]  # fmt: skip
"""Columns of ``card.csv``; ``status`` is ``ok``, ``n/a`` or ``not run``; ``below_floor`` names the floors above the
value (empty when none)."""


def missing_outputs(encoder: Encoder) -> str | None:
    """Why the model has no classifier output (or prompt score) for any of the protocol's findings, or ``None``."""
    if encoder.any_zero_shot:
        return None
    notes = list(encoder.zero_shot_notes.values())
    if len(notes) == 1:
        return notes[0]
    looked = ", ".join(repr(t.label) for t in encoder.targets[:6]) + (", ..." if len(encoder.targets) > 6 else "")
    first = f"; e.g. {notes[0]}" if notes else ""
    return f"the model answers none of the {len(encoder.targets)} findings asked about ({looked}){first}"


def missing_text_tower(encoder: Encoder) -> str | None:
    """Why the model cannot read prompts beyond one pair per finding, or ``None``."""
    return None if encoder.embed_texts is not None else f"{encoder.spec} has no text tower to read the prompts"


REQUIREMENTS: dict[str | None, Callable[[Encoder], str | None]] = {
    None: lambda encoder: None,
    "outputs": missing_outputs,
    "text": missing_text_tower,
}
"""What a method needs (``methods`` in the card's YAML) -> the reason a model lacks it, or ``None``."""


@dataclass(frozen=True)
class Entry:
    """One benchmark of the card (see ``configs/card.yaml``)."""

    name: str
    data: str | None
    version: str | None
    metric: str
    methods: dict[str, str | None]
    floor: dict[str, str | float]


@dataclass(frozen=True)
class RunMetric:
    """One of the model's own results read from its run: the metric key, the row's label, its floors (label ->
    metric key of the run) and its caveats (metric key of a flag the run logs as 1 -> what the reader must know)."""

    key: str
    label: str
    floor: dict[str, str] = field(default_factory=dict)
    caveats: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Card:
    """The card's YAML, checked against the protocols it names."""

    path: Path
    entries: tuple[Entry, ...]
    run_metrics: tuple[RunMetric, ...]


@dataclass
class Row:
    """One line of the card."""

    benchmark: str
    protocol: str
    method: str = ""
    metric: str = ""
    value: float = math.nan
    ci_low: float = math.nan
    ci_high: float = math.nan
    floor: str = ""
    status: str = "ok"
    note: str = ""
    below_floor: str = ""


@dataclass
class CardResult:
    """The rows, the model they describe and the benchmark runs behind them (name -> MLflow run id, name ->
    experiment)."""

    model: str
    rows: list[Row]
    runs: dict[str, str] = field(default_factory=dict)
    experiments: dict[str, str] = field(default_factory=dict)

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame([vars(row) for row in self.rows], columns=COLUMNS)


def _field(path: Path, where: str, message: str) -> BadInput:
    return BadInput(f"{path}: {where}: {message}")


def load_card(path: str | Path = DEFAULT_CARD, config_dir: str | Path = CONFIG_DIR) -> Card:
    """Read and check the card's YAML: every benchmark exists, and its metric, methods and floor methods are the
    protocol's own (so a typo stops the card before hours of benchmarks, naming the file and the field).

    Raises:
        BadInput: a missing or unreadable file, an unknown benchmark, metric, method or requirement.
    """
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"card config {path} does not exist (the default is configs/card.yaml)")
    try:
        node = OmegaConf.to_container(OmegaConf.load(path))
    except (OmegaConfBaseException, ValueError) as error:  # YAML syntax, interpolation
        raise BadInput(f"{path}: not a readable YAML file: {error}") from error
    if not isinstance(node, dict) or not isinstance(node.get("benchmarks") or {}, dict):
        raise BadInput(f"{path}: expected a mapping with `benchmarks:` (name -> settings) and `run_metrics:`")
    entries = tuple(_entry(path, name, settings, config_dir) for name, settings in (node["benchmarks"] or {}).items())
    rows = node.get("run_metrics") or []
    if not isinstance(rows, list):
        raise _field(path, "run_metrics", "expected a list of {key, label, floor}")
    return Card(path, entries, tuple(_run_metric(path, i, row) for i, row in enumerate(rows)))


def _entry(path: Path, name: str, settings: object, config_dir: str | Path) -> Entry:
    where = f"benchmarks.{name}"
    if not isinstance(settings, dict):
        raise _field(path, where, "expected a mapping with data, metric, methods and floor")
    unknown = sorted(set(settings) - {"data", "version", "metric", "methods", "floor"})
    if unknown:
        raise _field(path, where, f"unknown key(s) {unknown}; expected data, version, metric, methods, floor")
    try:
        protocol = load_protocol(name, config_dir)
    except BadInput as error:
        raise _field(path, where, str(error)) from error
    metric, methods, floor = settings.get("metric"), settings.get("methods") or {}, settings.get("floor") or {}
    if not isinstance(metric, str) or metric not in protocol.metrics:
        raise _field(path, f"{where}.metric", f"{metric!r} is not a metric of {name} ({_known(protocol.metrics)})")
    if not isinstance(methods, dict) or not methods:
        raise _field(path, f"{where}.methods", "expected method -> requirement (null, outputs or text)")
    for method, needs in methods.items():
        _check_method(path, f"{where}.methods", protocol, method)
        if not isinstance(needs, str | None) or needs not in REQUIREMENTS:
            raise _field(path, f"{where}.methods.{method}", f"requirement {needs!r} is not null, outputs or text")
    if not isinstance(floor, dict):
        raise _field(path, f"{where}.floor", "expected label -> a method of the protocol or a number")
    for label, source in floor.items():
        if not isinstance(source, int | float) or isinstance(source, bool):
            _check_method(path, f"{where}.floor.{label}", protocol, source)
    version = settings.get("version")
    if version is not None and str(version) not in protocol.versions:
        raise _field(path, f"{where}.version", f"{version!r} is not a version of {name} ({_known(protocol.versions)})")
    data = settings.get("data")
    return Entry(name, None if data is None else str(data), None if version is None else str(version), str(metric),
                 dict(methods), dict(floor))  # fmt: skip


def _check_method(path: Path, where: str, protocol: Protocol, method: object) -> None:
    if not isinstance(method, str) or method not in protocol.methods:
        raise _field(path, where, f"{method!r} is not a method of {protocol.name} ({_known(protocol.methods)})")


def _known(keys: Mapping) -> str:
    names = list(keys)
    return "known: " + ", ".join(names[:12]) + (f", ... ({len(names)} in all)" if len(names) > 12 else "")


def _run_metric(path: Path, index: int, row: object) -> RunMetric:
    floor = row.get("floor") or {} if isinstance(row, dict) else None
    caveats = row.get("caveats") or {} if isinstance(row, dict) else None
    if not (isinstance(row, dict) and isinstance(row.get("key"), str) and isinstance(row.get("label"), str)
            and isinstance(floor, dict) and all(isinstance(key, str) for key in floor.values())
            and isinstance(caveats, dict) and all(isinstance(text, str) for text in caveats.values())):  # fmt: skip
        raise _field(path, f"run_metrics[{index}]", "expected {key: <metric key>, label: <text>, floor: {<label>: "
                     "<key>}, caveats: {<flag key>: <text>}}")  # fmt: skip
    return RunMetric(row["key"], row["label"], dict(floor), {str(k): v for k, v in caveats.items()})


def data_problem(entry: Entry, card: Path) -> str | None:
    """Why ``entry`` cannot run on its configured data, or ``None``."""
    if entry.data is None:
        return f"no data configured (benchmarks.{entry.name}.data is null in {card})"
    if not Path(entry.data).is_dir():
        return f"data folder {entry.data} does not exist (benchmarks.{entry.name}.data in {card})"
    return None


def unmet(entry: Entry, encoder: Encoder) -> dict[str, str]:
    """Method -> why the model cannot take it, for the entry's methods it cannot take."""
    reasons = {method: REQUIREMENTS[needs](encoder) for method, needs in entry.methods.items()}
    return {method: reason for method, reason in reasons.items() if reason}


def protocol_cell(name: str, version: str, fingerprint: str | None = None) -> str:
    return f"{name} {version}" + (f" (test {fingerprint})" if fingerprint else "")


def not_run_row(entry: Entry, version: str, reason: str) -> Row:
    return Row(entry.name, protocol_cell(entry.name, version), metric=entry.metric, status="not run", note=reason)


def na_rows(entry: Entry, protocol: str, reasons: Mapping[str, str]) -> list[Row]:
    """One ``n/a`` row per method the model cannot take, with its reason."""
    return [Row(entry.name, protocol, method, entry.metric, status="n/a", note=reasons[method])
            for method in entry.methods if method in reasons]  # fmt: skip


def result_rows(entry: Entry, table: pd.DataFrame, protocol: str, reasons: Mapping[str, str], run_id: str) -> list[Row]:
    """The entry's rows from a benchmark's table (``runner.TABLE_COLUMNS``): each method's headline value and
    interval, the floor beside it; a method the model cannot take, or without a value, is ``n/a`` with why."""
    cells = table.set_index(["protocol", "metric"])
    floors = {label: float(source) if isinstance(source, int | float) else _cell(cells, source, entry.metric)[0]
              for label, source in entry.floor.items()}  # fmt: skip
    floor = floor_cell(floors)
    rows = []
    for method in entry.methods:
        if method in reasons:
            rows.append(
                Row(entry.name, protocol, method, entry.metric, floor=floor, status="n/a", note=reasons[method])
            )
            continue
        value, low, high = _cell(cells, method, entry.metric)
        if not math.isfinite(value):
            why = f"no value on these items (the report table.md of benchmark run {run_id} says why)"
            rows.append(Row(entry.name, protocol, method, entry.metric, floor=floor, status="n/a", note=why))
            continue
        rows.append(Row(entry.name, protocol, method, entry.metric, value, low, high, floor,
                        below_floor=below(value, floors)))  # fmt: skip
    return rows


def _cell(cells: pd.DataFrame, method: str, metric: str) -> tuple[float, float, float]:
    if (method, metric) not in cells.index:
        return math.nan, math.nan, math.nan
    row = cells.loc[(method, metric)]
    return float(row["value"]), float(row["ci_low"]), float(row["ci_high"])


def floor_cell(floors: Mapping[str, float]) -> str:
    return "; ".join(f"{label} {value:.3f}" if math.isfinite(value) else f"{label} n/a"
                     for label, value in floors.items())  # fmt: skip


def below(value: float, floors: Mapping[str, float]) -> str:
    """The floors ``value`` falls short of, joined (higher-is-better headline metrics); empty when none or NaN."""
    if not math.isfinite(value):
        return ""
    return "; ".join(label for label, floor in floors.items() if math.isfinite(floor) and value < floor)


def run_metric_rows(specs: tuple[RunMetric, ...], metrics: Mapping[str, float], task: str,
                    headline: Headline = DEFAULT_HEADLINE) -> list[Row]:  # fmt: skip
    """The model's own results (the CXR-LT rows) from its run's metrics: a row per spec whose key the run has, those
    of the ``headline``'s sets first (in card order), then the others titled with its ``others``."""
    rows = []
    for spec in sorted(specs, key=lambda spec: not headline.ranks(spec.key.split("/")[0])):
        if spec.key not in metrics:
            continue
        ranked = headline.ranks(spec.key.split("/")[0])
        label = spec.label if ranked or not headline.others else f"{spec.label}, {headline.others}"
        floors = {label: _number(metrics.get(key)) for label, key in spec.floor.items()}
        floors = {label: value for label, value in floors.items() if math.isfinite(value)}
        value = _number(metrics[spec.key])
        low, high = _number(metrics.get(f"{spec.key}_ci_low")), _number(metrics.get(f"{spec.key}_ci_high"))
        status = "ok" if math.isfinite(value) else "n/a"
        notes = [text for flag, text in spec.caveats.items() if _number(metrics.get(flag)) == 1]
        prefix, _, macro = spec.key.rpartition("/")
        left_out = left_out_note(dict(metrics), prefix) if macro == "mAP" else None
        if left_out:  # why an estimate may sit outside its own interval (docs/evaluation.md)
            notes.append(left_out)
        if status != "ok":
            notes.insert(0, f"the run logged a non-finite {spec.key}")
        rows.append(Row(f"CXR-LT {task}", f"the run's {label}", "model", spec.key, value, low, high,
                        floor_cell(floors), status, "; ".join(notes), below(value, floors)))  # fmt: skip
    return rows


def _number(value: object) -> float:
    """A number read back from a run, NaN unless it is a finite float."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan
    return number if math.isfinite(number) else math.nan


def value_cell(row: Row, digits: int = 3) -> str:
    """The value with its interval, and ``below floor: <labels>`` when it falls short of a floor."""
    if row.status != "ok":
        return row.status
    text = f"{row.value:.{digits}f}"
    if math.isfinite(row.ci_low) and math.isfinite(row.ci_high):
        text += f" [{row.ci_low:.{digits}f}, {row.ci_high:.{digits}f}]"
    return f"{text} below floor: {row.below_floor}" if row.below_floor else text


STATUS_CLASS = {"ok": "ok", "n/a": "na", "not run": "not-run"}
"""Row status -> HTML class (greyed unless ``ok``; a result below its floor is ``below-floor``, red)."""
MARKDOWN_ESCAPES = str.maketrans({"\\": "\\\\", "|": "\\|", "<": "&lt;", ">": "&gt;"})
"""What a markdown table cell must not hold raw: a backslash, the column separator, and angle brackets (a
renderer takes ``<name>`` for an HTML tag and drops it)."""
HEADER = ("benchmark", "protocol (version)", "method", "headline metric", "value [95% CI]", "floor", "note")


def cells(row: Row) -> tuple[str, ...]:
    return (row.benchmark, row.protocol, row.method, row.metric, value_cell(row), row.floor, row.note)


def _md(text: str, limit: int | None) -> str:
    text = " ".join(str(text).split())
    text = text if limit is None or len(text) <= limit else text[: limit - 3] + "..."
    return text.translate(MARKDOWN_ESCAPES)


def render_markdown(result: CardResult, title: str, note_limit: int | None = None) -> str:
    """The card as markdown: a title line, the table, and the benchmark runs it was read from."""
    lines = [f"# {_md(title, None)}", "", "| " + " | ".join(HEADER) + " |", "|---" * len(HEADER) + "|"]
    for row in result.rows:
        values = [_md(cell, None) for cell in cells(row)[:-1]] + [_md(row.note, note_limit)]
        lines.append("| " + " | ".join(values) + " |")
    if result.runs:
        runs = ", ".join(f"{_md(name, None)} `{run_id}` in `{result.experiments.get(name, 'benchmark-' + name)}`"
                         for name, run_id in result.runs.items())  # fmt: skip
        lines += ["", f"Benchmark runs: {runs}."]
    if _has_interval(result):
        lines += ["", _md(CXRLT_CI_RULE, None)]
    return "\n".join(lines) + "\n"


#: Under the table: how the CXR-LT rows' intervals are drawn (each benchmark's are described in its own section).
CXRLT_CI_RULE = f"CXR-LT rows: {CI_RULE}"


def _has_interval(result: CardResult) -> bool:
    return any(row.benchmark.startswith("CXR-LT") and math.isfinite(row.ci_low) for row in result.rows)


def _html_class(row: Row) -> str:
    return "below-floor" if row.below_floor else STATUS_CLASS.get(row.status, "na")


def render_html(result: CardResult, title: str) -> str:
    """The same table as a standalone HTML page (every cell escaped)."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in HEADER)
    body = "\n".join(
        f'<tr class="{_html_class(row)}">'
        + "".join(f"<td>{html.escape(str(cell))}</td>" for cell in cells(row)) + "</tr>"
        for row in result.rows
    )  # fmt: skip
    runs = "".join(f"<li>{html.escape(n)}: <code>{html.escape(r)}</code> in <code>"
                   f"{html.escape(result.experiments.get(n, 'benchmark-' + n))}</code></li>"
                   for n, r in result.runs.items())  # fmt: skip
    return (
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>\n'
        "<style>table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}"
        ".na,.not-run{color:#777}.below-floor{color:#b00}</style></head>\n"
        f"<body><h1>{html.escape(title)}</h1>\n<table><thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody></table>\n"
        + (f"<p>Benchmark runs:</p><ul>{runs}</ul>\n" if runs else "")
        + (f"<p>{html.escape(CXRLT_CI_RULE)}</p>\n" if _has_interval(result) else "")
        + "</body></html>\n"
    )
