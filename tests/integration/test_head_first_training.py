"""two_phase=head_first through the real CLI: the learning rate the run logs follows the head-only phase, then the
warm-up and cosine over the rest, and the kept checkpoint is a phase-2 epoch.

The rates of every parameter group and the frozen backbone are checked by hand in tests/unit/test_head_first.py.
"""

from __future__ import annotations

import pytest

from tests.conftest import train_tiny_manifest_run

pytestmark = pytest.mark.e2e  # trains through the real CLI: make test-e2e (docs/development.md)


def test_head_first_runs_its_phases_and_keeps_a_phase_two_checkpoint(make_manifest, tmp_path, run_env):
    """16 training images at batch 8: 2 steps an epoch, 6 in 3 epochs. Epoch 0 is the head-only phase (steps 0-1);
    the warm-up is steps 2-3 and the cosine steps 4-6. ``train/lr`` is the backbone's rate for the next step at
    each epoch's end: step 2 (warm-up 1/2: 5e-5), step 4 (the full 1e-4), step 6 (the cosine's floor, 0)."""
    client, run = train_tiny_manifest_run(
        tmp_path, make_manifest(n=48), run_env, "two_phase=head_first", "callbacks.two_phase.epochs=1",
        "callbacks.two_phase.lr=5e-3", "trainer.max_epochs=3", "model.lr=1e-4", "model.head_lr=1e-3",
        "model.warmup_epochs=1", "model.min_lr_factor=0.0",
    )  # fmt: skip
    assert run.info.status == "FINISHED"
    assert run.data.params["callbacks.two_phase.name"] == "head_first"
    history = sorted(client.get_metric_history(run.info.run_id, "train/lr"), key=lambda m: m.step)
    assert [m.value for m in history] == pytest.approx([5e-5, 1e-4, 0.0], abs=1e-12)
    assert run.data.metrics["best_epoch"] >= 1  # selection starts afresh at the switch
