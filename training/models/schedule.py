"""Learning-rate schedule: linear warmup then cosine decay, stepped per optimiser step."""

from __future__ import annotations

import math


def warmup_cosine(step: int, total_steps: int, warmup_steps: int, min_factor: float = 0.0) -> float:
    """LR multiplier at ``step``.

    Warmup keeps AdamW's first, badly-estimated second moments from taking huge steps on a freshly
    initialised head; cosine then anneals to ``min_factor`` exactly at ``total_steps``.
    """
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_factor + (1.0 - min_factor) * 0.5 * (1.0 + math.cos(math.pi * progress))
