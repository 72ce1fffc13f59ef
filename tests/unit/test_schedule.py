"""Warmup + cosine learning-rate multiplier; a phase start as a share of the run."""

import math

import pytest

from training.models.schedule import epoch_at_fraction, warmup_cosine


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


@pytest.mark.parametrize(
    ("fraction", "max_epochs", "epoch"),
    [(0.8, 200, 160), (0.8, 20, 16), (0.7, 20, 14), (0.7, 8, 6), (0.8, 1, 0), (1.0, 5, 4), (0.0, 5, 0)],
)
def test_epoch_at_fraction_follows_max_epochs(fraction, max_epochs, epoch):
    """LDAM-DRW's 160 of 200 is 0.8; the same share is epoch 16 of 20; the switch always falls inside the run."""
    assert epoch_at_fraction(fraction, max_epochs) == epoch


def test_epoch_at_fraction_refuses_shares_outside_the_run():
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        epoch_at_fraction(1.5, 10)
    with pytest.raises(ValueError, match="max_epochs"):
        epoch_at_fraction(0.5, 0)


def test_run_epochs_reads_a_step_bounded_run_as_the_epochs_its_steps_take():
    from types import SimpleNamespace

    from training.models.schedule import run_epochs

    def trainer(max_epochs, max_steps, batches=12, accumulate=1):
        return SimpleNamespace(max_epochs=max_epochs, max_steps=max_steps, num_training_batches=batches,
                               accumulate_grad_batches=accumulate)  # fmt: skip

    assert run_epochs(trainer(8, -1)) == 8  # the epoch bound wins when set
    assert run_epochs(trainer(-1, 3)) == 1  # 3 steps of a 12-batch epoch: inside the first epoch
    assert run_epochs(trainer(-1, 30)) == 3  # 30 / 12 = 2.5 epochs, rounded up
    assert run_epochs(trainer(-1, 30, accumulate=2)) == 5  # 60 batches
    with pytest.raises(ValueError, match="max_epochs >= 1 or trainer.max_steps > 0"):
        run_epochs(trainer(-1, -1))
