"""A readable report of a run's tables and figures, for people who do not want to click through MLflow.

``report.md`` for the repository-minded and diffs; ``report.html`` with the figures embedded, because MLflow's
artifact viewer renders an HTML file in place but shows a markdown file's image links as raw text.
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

import numpy as np
from markdown_it import MarkdownIt

from evaluation.conventions import choices_section, headline_notes, of_evaluation
from evaluation.groups import GROUPS
from evaluation.headline import DEFAULT as DEFAULT_HEADLINE
from evaluation.headline import Headline
from evaluation.intervals import CI_RULE, left_out_note
from evaluation.metric_registry import SUITE, UNSEEN_SCOPES, UNSEEN_SETS
from evaluation.suite import DROPPED_SUFFIX

HEADLINE = SUITE.headline()
"""The registry's metrics that every metric set has (not the ``*_valthr`` ones), in registry order."""
#: What the report and the terminal say about a held-out subset drawn from the training split (docs/rules.md §10).
TRAINED_ON_CAVEAT = "the model saw these cases in training: optimistic"


def ranking_chain() -> tuple[str, ...]:
    """The challenge's ranking chain, read from the registry on every call: mAP, then the tie-breaks in order."""
    return tuple(metric.name for metric in SUITE.tie_break_chain())


def chain_rule() -> str:
    """The chain as one sentence, lower-is-better metrics marked (docs/rules.md §2)."""
    lower = SUITE.lower_is_better()
    names = [f"{name} (lower wins)" if name in lower else name for name in ranking_chain()]
    return f"ranked by {names[0]}, ties broken by " + ", then ".join(names[1:]) if len(names) > 1 else names[0]


def chain_header() -> str:
    """The short form for a terminal line: ``ranking chain; lower mECE wins``."""
    lower = [name for name in ranking_chain() if name in SUITE.lower_is_better()]
    return "ranking chain" + (f"; lower {', '.join(lower)} wins" if lower else "")


def headline_rows() -> tuple[str, ...]:
    """Rows of every headline table: the whole ranking chain in chain order, then the other headline metrics
    (``ECE_pooled``), so a reader can rank two runs top-down without knowing the rule."""
    chain = ranking_chain()
    return chain + tuple(name for name in SUITE.headline() if name not in chain)


def chain_summary(metrics: dict[str, float], prefix: str, digits: int = 3) -> str:
    """``mAP 0.258 [0.251, 0.283], mAUROC 0.774 [...], ...``: every chain metric of ``prefix``, in chain order; a
    missing one shows as ``-`` rather than vanishing, so a gap in the chain is visible."""
    return ", ".join(f"{name} {_ci(metrics, f'{prefix}/{name}', digits)}" for name in ranking_chain())


def _ci(metrics: dict, key: str, digits: int = 4) -> str:
    value = metrics.get(key)
    if value is None or not np.isfinite(value):
        return "-"
    low, high = metrics.get(f"{key}_ci_low"), metrics.get(f"{key}_ci_high")
    return f"{value:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]" if low is not None else f"{value:.{digits}f}"


def interval_notes(evaluation) -> list[str]:
    """One sentence per headline metric whose point estimate lies outside its own bootstrap interval.

    Not an error: the challenge drops a class from a resample's macro mean when the resample has no positive of it
    (docs/rules.md §3), so resamples without a rare class average over easier classes. Saying how often that
    happened keeps a reader from distrusting either number.
    """
    notes = []
    for prefix, metric_set in evaluation.sets.items():
        result = metric_set.result
        for metric in HEADLINE:
            value, low, high = (result.metrics.get(f"{metric}{suffix}") for suffix in ("", "_ci_low", "_ci_high"))
            if value is None or low is None or not np.isfinite([value, low, high]).all() or low <= value <= high:
                continue
            rule = "mAUROC" if metric == "mAUROC" else "mAP"  # AUROC also needs a negative; the rest a positive
            dropped = result.metrics.get(f"{rule}{DROPPED_SUFFIX}")
            why = (f"{int(dropped)} of {result.n_boot} resamples left out a class these images define"
                   if dropped is not None else "resamples left out classes")  # fmt: skip
            notes.append(f"{prefix}/{metric} {value:.4f} lies outside its 95% CI [{low:.4f}, {high:.4f}]: {why} "
                         "(the challenge's rule, docs/rules.md §3).")  # fmt: skip
    return notes


def left_out_notes(evaluation) -> list[str]:
    """The "n classes left out" line of every metric set that leaves a class out (:mod:`evaluation.intervals`)."""
    notes = []
    for prefix, metric_set in evaluation.sets.items():
        note = left_out_note(evaluation.metrics, prefix, getattr(metric_set.result, "n_boot", None))
        if note:
            notes.append(note)
    return notes


def summary_lines(metrics: dict[str, float], unseen: dict[str, float] | None = None,
                  headline: Headline = DEFAULT_HEADLINE) -> list[str]:  # fmt: skip
    """The few numbers a user wants in the terminal when a run ends: the whole ranking chain with intervals of the
    test set the task is ranked on (``headline``), then groups, TTA, perturbed, the held-out subset and the unseen
    classes of a zero-shot run. Task 2 is ranked on its unseen classes, so it leads with them and its seen-class
    figures follow under the headline's ``others`` title: a first line is what a reader sets beside a leaderboard."""
    unseen = unseen or {}
    both = {**metrics, **unseen}
    lead = headline.prefix
    lines = [_test_line(both, lead, headline.name("test"))]
    if any(f"{lead}/{name}_ci_low" in both for name in ranking_chain()):  # what the brackets mean, where shown
        lines.append(CI_RULE)
    note = left_out_note(both, lead)
    if note:
        lines.append(note)
    seen, zero_shot = _seen_lines(metrics, headline), _unseen_block(unseen, headline)
    return lines + (seen + zero_shot if headline.ranks("test") else zero_shot + seen)


def _test_line(metrics: dict[str, float], prefix: str, title: str) -> str:
    """``title (ranking chain; ...): mAP ... (prevalence baseline mAP ...)`` of one test set."""
    baseline = metrics.get(f"{prefix}/prevalence_baseline_mAP", float("nan"))
    return f"{title} ({chain_header()}): {chain_summary(metrics, prefix)} (prevalence baseline mAP {baseline:.3f})"


def _seen_lines(metrics: dict[str, float], headline: Headline) -> list[str]:
    """The seen classes' lines after the headline, each titled as a figure the task is not ranked on where so."""
    ranked = headline.ranks("test")

    def say(text: str) -> str:
        return text if ranked else headline.other(text)

    lines = [] if ranked or "test/mAP" not in metrics else [_test_line(metrics, "test", say("test"))]
    groups = [f"{g} {metrics[f'test/group/{g}/mAP']:.3f}" for g in GROUPS if f"test/group/{g}/mAP" in metrics]
    if groups:
        lines.append(f"{say('mAP by group')}: " + " / ".join(groups))
    if "test_tta/mAP" in metrics:
        lines.append(f"{say('mAP with TTA')}: {_ci3(metrics, 'test_tta/mAP')}")
    if "test_perturbed/mAP" in metrics:
        lines.append(f"{say('mAP perturbed')}: {_ci3(metrics, 'test_perturbed/mAP')} "
                     f"({metrics['test_perturbed/delta/mAP']:+.3f})")  # fmt: skip
    if "test/calibration/mECE_before" in metrics and "test/calibration/mECE_after" in metrics:
        how = "applied" if metrics.get("calibration/applied") == 1 else "off, diagnostic fit"
        before, after = metrics["test/calibration/mECE_before"], metrics["test/calibration/mECE_after"]
        lines.append(f"{say('test mECE')} before/after temperature scaling ({how}): {before:.3f} -> {after:.3f}")
    if "heldout/mAP" in metrics:
        seen = f"; {TRAINED_ON_CAVEAT}" if metrics.get("heldout/trained_on") == 1 else ""
        lines.append(f"{say('held-out subset')} ({int(metrics.get('heldout/n_images', 0))} cases{seen}): "
                     + chain_summary(metrics, "heldout"))  # fmt: skip
    return lines


def _unseen_block(unseen: dict[str, float], headline: Headline) -> list[str]:
    """A zero-shot run's unseen-class lines: their chain (unless it is the headline already), then each analysis."""
    lines = []
    if "test_unseen/mAP" in unseen and not headline.ranks("test_unseen"):
        lines.append(f"unseen classes: {chain_summary(unseen, 'test_unseen')}")
    return lines + unseen_lines(unseen)


def unseen_lines(metrics: dict[str, float]) -> list[str]:
    """One line per Task 2 analysis the run has (``evaluation.metric_registry.UNSEEN_SETS``): its mAP with CI on
    the pooled, internal and external tests, the perturbed copy with its change from the plain test, and the
    held-out draw's size (docs/zero-shot.md, "Task 2 analyses as the paper reports them")."""
    lines = []
    for metric_set in UNSEEN_SETS:
        prefix = metric_set.prefix
        if f"{prefix}/mAP" not in metrics:
            continue
        scopes = [(scope, f"{prefix}/{scope}/mAP") for scope in UNSEEN_SCOPES if f"{prefix}/{scope}/mAP" in metrics]
        if metric_set is UNSEEN_SETS[0] and not scopes:  # the "unseen classes" line above already has it
            continue
        shown = ", ".join(f"{scope} {_ci3(metrics, key)}" for scope, key in scopes) or _ci3(metrics, f"{prefix}/mAP")
        delta = metrics.get(f"{prefix}/delta/mAP")
        change = f" ({delta:+.3f} vs test)" if delta is not None else ""
        size = f", {int(metrics[f'{prefix}/n_images'])} cases" if f"{prefix}/n_images" in metrics else ""
        lines.append(f"unseen mAP, {metric_set.title}{size}: {shown}{change}")
    return lines


def _ci3(metrics: dict, key: str) -> str:
    return _ci(metrics, key, digits=3)


def _heldout_section(evaluation) -> list[str]:
    """What the ``heldout`` column is, and whether the model saw those cases (docs/rules.md §10)."""
    draw = getattr(evaluation.sets.get("heldout"), "draw", None)
    if draw is None:
        return []
    headline = getattr(evaluation, "headline", DEFAULT_HEADLINE)
    title = "" if headline.ranks("heldout") or not headline.others else f", {headline.others}"
    lines = ["", f"## Held-out stability subset{title}", "",
             f"Column `heldout`: {draw.describe(with_caveat=False)}. The same protocol as `test` (metric suite, "
             "bootstrap, groups); the drawn image ids are in `evaluation/heldout.json`."]  # fmt: skip
    if draw.caveat:
        lines += ["", f"**Caveat: {draw.caveat}.** Compare held-out figures between runs, not with `test`."]
    return lines


def _unseen_section(evaluation) -> list[str]:
    """A zero-shot run's unseen-class report (``evaluation.unseen``, set by the test phase): the six classes on the
    internal, external and pooled tests, and the Task 2 analyses (TTA, perturbed, held-out) beside them."""
    unseen = getattr(evaluation, "unseen", None)
    if unseen is None:
        return []
    return ["", "## Task 2: unseen classes (zero-shot)", "", unseen.summary().rstrip()]


def _calibration_section(evaluation) -> list[str]:
    """ECE before and after temperature scaling on validation and test, and whether the scaling was applied: the
    numbers that show whether a run's mECE (a tie-break) came from the network or from the fitted temperature."""
    fit = getattr(evaluation, "calibration", None)
    if fit is None:
        return []
    m = evaluation.metrics
    t = fit.temperature
    value = f"T = {t[0]:.3f}" if fit.mode == "global" else f"T per class in [{t.min():.3f}, {t.max():.3f}]"
    if fit.applied:
        state = (f"applied ({fit.mode}, {value}, fitted on validation): every test column above and the stored "
                 "checkpoint use the scaled logits; `before` is the unscaled model.")  # fmt: skip
    else:
        state = (f"off (`calibration=none`): the test columns above are of the unscaled model; `after` shows what a "
                 f"global temperature fitted on validation would give ({value}), as a diagnostic only.")  # fmt: skip
    lines = ["", "## Calibration (temperature scaling)", "", f"Temperature scaling {state}"]
    if fit.fallback:
        lines.append(f"Classes without both positives and negatives on validation keep the global T: "
                     f"{', '.join(fit.fallback)}.")  # fmt: skip
    header = "| split | mECE before | mECE after | ECE_pooled before | ECE_pooled after | NLL before | NLL after |"
    lines += ["", header, "|---|---|---|---|---|---|---|"]
    for split in ("val", "test"):
        keys = [f"{split}/calibration/{name}_{when}" for name in ("mECE", "ECE_pooled", "nll")
                for when in ("before", "after")]  # fmt: skip
        lines.append(f"| {split} | " + " | ".join(f"{m[k]:.4f}" if k in m else "-" for k in keys) + " |")
    return lines


def _chain_table(metrics: dict[str, float], sets: list[str]) -> list[str]:
    """The ranking chain, then the unranked headline metrics, one column per metric set."""
    chain = ranking_chain()
    lines = ["| rank | metric | " + " | ".join(sets) + " |", "|---" * (len(sets) + 2) + "|"]
    for metric in headline_rows():
        rank = str(chain.index(metric) + 1) if metric in chain else "-"
        lines.append(f"| {rank} | {metric} | " + " | ".join(_ci(metrics, f"{s}/{metric}") for s in sets) + " |")
    return lines


def write_report(evaluation, path: Path, plots: list[Path]) -> Path:
    """Headline metrics per metric set, head-to-tail groups, per source, per class; figures linked."""
    m = evaluation.metrics
    sets = list(evaluation.sets)
    lines = ["# Evaluation report", ""]
    n_boot = getattr(evaluation.sets["test"].result, "n_boot", 0) if "test" in evaluation.sets else 0
    lines += [f"Test images: {len(evaluation.predictions['test'])}. Values are point estimates; {CI_RULE}, "
              f"{n_boot} resamples here.", ""]  # fmt: skip
    headline = getattr(evaluation, "headline", DEFAULT_HEADLINE)
    unseen = getattr(evaluation, "unseen", None)
    both = {**m, **(unseen.metrics if unseen is not None else {})}
    of = f" of the {headline.title}" if headline.title else ""
    baseline = both.get(f"{headline.prefix}/prevalence_baseline_mAP")
    if baseline is not None:
        lines += [f"Prevalence baseline (constant predictor) mAP{of}: {baseline:.4f}.", ""]
    chain = ranking_chain()
    lines += [f"## Headline{': ' + headline.title if headline.title else ''}", "",
              f"The challenge's ranking chain{of}: {chain_rule()} (docs/rules.md §2). Rank 1-{len(chain)} rows are "
              "that chain, top-down; unranked rows follow.", ""]  # fmt: skip
    if headline.ranks("test"):
        lines += _chain_table(m, sets)
    else:  # the ranked classes' own sets, then the seen classes' table under its own title
        lines += _chain_table(both, [s.prefix for s in headline.sets if f"{s.prefix}/mAP" in both])
        draw = getattr(unseen, "heldout", None)
        if draw is not None and f"{headline.heldout}/mAP" in both:
            lines += ["", f"Column `{headline.heldout}`: {draw.describe()}."]
        others = headline.others or "classes this task is not ranked on"
        lines += ["", f"## {others[:1].upper()}{others[1:]}", "",
                  f"Not what this task is ranked on (the {headline.title} above are); rows in chain order so two runs "
                  "read alike.", ""] + _chain_table(m, sets)  # fmt: skip
    if "test_perturbed/delta/mAP" in m:
        lines += ["", f"Perturbed minus original mAP: {m['test_perturbed/delta/mAP']:+.4f}."]
    notes = [f"{note}." for note in left_out_notes(evaluation)] + interval_notes(evaluation)
    if notes:
        lines += ["", *[f"- {note}" for note in notes]]
    lines += headline_notes(evaluation)  # the platform's readings of the figures above, and their alternatives
    lines += _calibration_section(evaluation)
    lines += _heldout_section(evaluation)
    lines += _unseen_section(evaluation)

    lines += ["", "## Head-to-tail (groups by training prevalence)", "",
              "| group | classes | " + " | ".join(f"{s} mAP" for s in sets) + " |", "|---" * (len(sets) + 2) + "|"]  # fmt: skip
    for group in (g for g in GROUPS if g in evaluation.groups):
        members = ", ".join(evaluation.labels[c] for c in evaluation.groups[group])
        cells = " | ".join(_ci(m, f"{s}/group/{group}/mAP") for s in sets)
        lines.append(f"| {group} | {members} | {cells} |")

    if evaluation.sources:
        lines += [
            "",
            "## Per source (bootstrap within each source)",
            "",
            "| source | mAP | mAUROC | mF1 |",
            "|---|---|---|---|",
        ]
        for name, values in evaluation.sources.items():
            lines.append(f"| {name} | {_ci(values, 'mAP')} | {_ci(values, 'mAUROC')} | {_ci(values, 'mF1')} |")

    lines += [
        "",
        "## Per class (test)",
        "",
        f"| class | train prevalence | AP | AUROC | F1 ({of_evaluation(evaluation).threshold_text}) | ECE |",
        "|---|---|---|---|---|---|",
    ]
    titles = getattr(evaluation, "label_titles", None) or {}
    for c, name in enumerate(evaluation.labels):
        cells = [f"{m[k]:.4f}" if k in m else "-" for k in (f"test/{x}/{name}" for x in ("ap", "auroc", "f1", "ece"))]
        shown = f"{name} ({titles[name]})" if name in titles else name
        lines.append(f"| {shown} | {evaluation.train_prevalence[c]:.3%} | " + " | ".join(cells) + " |")
    lines += choices_section(evaluation)
    if plots:
        lines += ["", "## Figures", ""] + [f"![{p.stem}]({p.name})" for p in plots]
    path.write_text("\n".join(lines) + "\n")
    return path


#: ``![alt](file.png)`` image links of the markdown report, to be embedded.
IMAGE_LINK = re.compile(r"!\[(?P<alt>[^\]]*)\]\((?P<name>[^)\s]+\.png)\)")
STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:1100px;margin:1.5em auto;padding:0 1em;color:#222}"
    "table{border-collapse:collapse;margin:.6em 0;font-size:.85em}th,td{border:1px solid #ccc;padding:.25em .5em}"
    "th{background:#f3f3f3}img{max-width:100%;display:block;margin:1em 0}"
)


def write_html(markdown_path: Path, path: Path) -> Path:
    """``report.md`` as one self-contained HTML page: tables rendered, figures beside it embedded as data URIs."""

    def embed(match: re.Match) -> str:
        figure = markdown_path.parent / match["name"]
        if not figure.is_file():
            return match[0]
        data = base64.b64encode(figure.read_bytes()).decode("ascii")
        return f'<img alt="{html.escape(match["alt"])}" src="data:image/png;base64,{data}">'

    body = (
        MarkdownIt("commonmark", {"html": True})
        .enable("table")
        .render(IMAGE_LINK.sub(embed, markdown_path.read_text()))
    )
    title = "Evaluation report"
    path.write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>"
                    f"<style>{STYLE}</style></head><body>{body}</body></html>\n")  # fmt: skip
    return path
