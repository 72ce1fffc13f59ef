"""Schedules over a run: the learning rate (linear warmup then cosine decay, stepped per optimiser step, after an
optional head-only phase at its own rate) and the epoch at which a phase starts, given as a share of
``trainer.max_epochs`` (DRW, the two-phase experts)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class HeadOnlyPhase:
    """The first ``epochs`` epochs train the head alone at learning rate ``lr`` (``two_phase=head_first``)."""

    epochs: int
    lr: float


def warmup_cosine(step: int, total_steps: int, warmup_steps: int, min_factor: float = 0.0) -> float:
    """LR multiplier at ``step``.

    Warmup keeps AdamW's first, badly-estimated second moments from taking huge steps on a freshly
    initialised head; cosine then anneals to ``min_factor`` exactly at ``total_steps``.
    """
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_factor + (1.0 - min_factor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def phased_multiplier(
    step: int, phase_one_steps: int, phase_one_factor: float, total_steps: int, warmup_steps: int, min_factor: float
) -> float:
    """LR multiplier of one parameter group when the run starts with a head-only phase of ``phase_one_steps``.

    Phase one holds ``phase_one_factor`` (the group's phase-one rate over its own rate; 0 for the frozen backbone),
    a constant rate as the 2026 Task 1 winner's head warm-up used. The warm-up and cosine of
    :func:`warmup_cosine` then run over the remaining steps only, so they start when the backbone starts
    learning. With ``phase_one_steps`` 0 this is :func:`warmup_cosine`.
    """
    if step < phase_one_steps:
        return phase_one_factor
    return warmup_cosine(step - phase_one_steps, total_steps - phase_one_steps, warmup_steps, min_factor)


def run_epochs(trainer) -> int:
    """The run's length in epochs, for schedules written as a share of the run.

    A run bounded by steps still has a length: the epochs its steps take, rounded up, so a share means the same
    under either bound. Raises ``ValueError`` when neither bound is known.
    """
    if trainer.max_epochs is not None and int(trainer.max_epochs) >= 1:
        return int(trainer.max_epochs)
    batches = getattr(trainer, "num_training_batches", float("inf"))
    steps = getattr(trainer, "max_steps", -1)
    if steps is not None and steps > 0 and 0 < batches < float("inf"):
        return max(1, math.ceil(steps * getattr(trainer, "accumulate_grad_batches", 1) / batches))
    raise ValueError(
        f"a schedule written as a share of the run needs trainer.max_epochs >= 1 or trainer.max_steps > 0 "
        f"(max_epochs={trainer.max_epochs}, max_steps={steps})"
    )


def epoch_at_fraction(fraction: float, max_epochs: int) -> int:
    """The 0-based epoch at which a share ``fraction`` of ``max_epochs`` has passed, kept inside the run.

    Why: a switch written as an epoch number silently changes meaning when a run is made shorter or longer. Rounded
    and clamped to ``[0, max_epochs - 1]``, so the switch always happens (a one-epoch smoke run is all later phase).
    """
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"an epoch fraction must be in [0, 1], got {fraction}")
    if max_epochs is None or int(max_epochs) < 1:
        raise ValueError(f"an epoch fraction needs trainer.max_epochs >= 1, got {max_epochs}")
    last = int(max_epochs) - 1
    return min(last, max(0, round(fraction * int(max_epochs))))
