"""The training rule of a zero-shot task, checked before anything trains (docs/rules.md §11).

Checked on the manifest the data module actually loaded, independently of the leak guard, because a guarded copy
edited by hand, another source or an override skipping the guard would otherwise train on banned images silently.
A parent run (``stage=crt``) not itself trained under the rule is refused too: its backbone saw the images.
Both fail before the MLflow run is created.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pandas as pd

from training.data.manifest import read_manifest_table
from training.errors import UserError
from training.zeroshot.leak_guard import NOTHING_TO_CHECK, RULE_SPLITS, unseen_positive

RULE = "docs/rules.md §11"
SHOWN_IDS = 5


class TrainingRuleError(UserError):
    """A zero-shot run that would train or validate on images of its unseen findings, or start from such a model."""


def check_training_rule(datamodule, unseen: Sequence[str]) -> None:
    """Refuse training when a train or val image of ``datamodule`` is positive for an unseen finding.

    Images are looked up in the full manifest, which still has the unseen columns; one without any of them cannot be
    checked (the guard says so and tags the run).
    """
    full_path = getattr(datamodule.source, "full_manifest", None) or datamodule.manifest.source_file
    full = read_manifest_table(full_path)
    columns = [c for c in unseen if c in full.columns]
    if not columns:
        return
    banned = full.loc[unseen_positive(full, columns), ["image_id", *columns]].set_index("image_id")
    problems = []
    for split in RULE_SPLITS:
        ids = datamodule.manifest.split(split)["image_id"]
        hit = banned.loc[banned.index.intersection(ids)]
        if len(hit):
            per_label = ", ".join(f"{c} {int((pd.to_numeric(hit[c], errors='coerce') == 1).sum())}" for c in columns)
            shown = ", ".join(hit.index[:SHOWN_IDS]) + (", ..." if len(hit) > SHOWN_IDS else "")
            problems.append(f"{split}: {len(hit)} images ({per_label}; e.g. {shown})")
    if problems:
        raise TrainingRuleError(
            f"{datamodule.manifest.source_file}: a zero-shot task may not train or validate on images positive for "
            f"an unseen finding ({RULE}), but " + "; ".join(problems) + f" (positives read from {full_path}). "
            "Train on the manifest the leak guard writes (training.zeroshot.leak_guard), not on a copy of your own."
        )


def check_parent_run(client, parent_run: str, unseen: Sequence[str]) -> None:
    """Refuse a parent run (``stage=crt``) not trained under the rule for every one of ``unseen``.

    A parent tagged ``NOTHING_TO_CHECK`` (no unseen label in its rows) went through the same guard this run will on
    such a release; refusing it would refuse every two-stage run there while the one-stage run trains, so it passes.
    """
    from mlflow.exceptions import MlflowException

    try:
        tags = client.get_run(parent_run).data.tags
    except MlflowException:
        return  # a missing run is the stage's to report, by name, when it loads it
    checked = tags.get("cxrlt.training_rule.checked") in ("true", NOTHING_TO_CHECK)
    covered = set(unseen) <= set(filter(None, tags.get("cxrlt.leak_guard.unseen", "").split(",")))
    if not (checked and covered):
        raise TrainingRuleError(
            f"parent run {parent_run} (task {tags.get('task', '?')!r}) was not trained under the zero-shot training "
            f"rule for {', '.join(unseen)} ({RULE}): its backbone saw images of those findings. Start from a run "
            "of this zero-shot task (its tag cxrlt.training_rule.checked is 'true')."
        )


def enforce_training_rule(
    unseen: Sequence[str] | None, datamodule, parent_run: str | None, client: Callable[[], object]
) -> None:
    """Both checks for a zero-shot task (``unseen`` listed); nothing otherwise. ``client`` is called only if needed."""
    if not unseen:
        return
    check_training_rule(datamodule, unseen)
    if parent_run:
        check_parent_run(client(), str(parent_run), unseen)
