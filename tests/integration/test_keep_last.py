"""`checkpoint.keep_last=true` end to end: the run tests and logs its final epoch, and the score it logs as the kept
checkpoint's (what `make register` ranks by) is that epoch's validation value, not the best one."""

from __future__ import annotations

import pytest

from tests.conftest import train_tiny_manifest_run

pytestmark = pytest.mark.e2e  # trains through the real CLI: make test-e2e (docs/development.md)


def test_keep_last_run_tests_and_ranks_its_final_epoch(make_manifest, tmp_path, run_env):
    manifest = make_manifest(n=48)
    client, run = train_tiny_manifest_run(tmp_path, manifest, run_env, "checkpoint.keep_last=true",
                                          "trainer.max_epochs=3")  # fmt: skip
    history = sorted(client.get_metric_history(run.info.run_id, "val/mAP"), key=lambda m: m.step)
    assert len(history) == 3 and run.data.metrics["best_epoch"] == 2
    assert run.data.metrics["val/mAP_best"] == history[-1].value
