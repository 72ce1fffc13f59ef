"""Warmup + cosine learning-rate multiplier."""

import math

import pytest

from training.models.schedule import warmup_cosine


def test_linear_warmup_then_cosine_to_the_floor():
    total, warmup = 100, 10
    assert warmup_cosine(0, total, warmup) == pytest.approx(0.1)
    assert warmup_cosine(9, total, warmup) == pytest.approx(1.0)
    assert warmup_cosine(10, total, warmup) == pytest.approx(1.0)
    assert warmup_cosine(55, total, warmup) == pytest.approx(0.5)  # half way through the cosine
    assert warmup_cosine(100, total, warmup, min_factor=0.01) == pytest.approx(0.01)
    middle = warmup_cosine(32, total, warmup, min_factor=0.2)
    assert middle == pytest.approx(0.2 + 0.8 * 0.5 * (1 + math.cos(math.pi * 22 / 90)))


def test_no_warmup_starts_at_full_rate():
    assert warmup_cosine(0, 50, 0) == pytest.approx(1.0)
