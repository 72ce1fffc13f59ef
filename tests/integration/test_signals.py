"""A training stopped by SIGTERM, as ``timeout`` or a scheduler stops ``make train``: non-zero exit, the run KILLED,
and one line whose command, typed as printed, continues the same run to FINISHED."""

import re
import shlex
import signal
import subprocess
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tests.conftest import TINY_MANIFEST_RUN

pytestmark = pytest.mark.e2e  # trains through `make train`: make test-e2e

REPO = Path(__file__).resolve().parents[2]
STOPPED = re.compile(r"^training\.train: stopped by SIGTERM; run (\w+) is marked KILLED; continue it with: (make train .+)$",
                     re.MULTILINE)  # fmt: skip


def test_sigterm_to_make_train_exits_non_zero_marks_the_run_killed_and_prints_the_command_that_resumes_it(
    tmp_path, make_manifest, run_env
):
    manifest = make_manifest(n=48)
    args = [*TINY_MANIFEST_RUN, f"data.source.manifest={manifest}", "trainer.max_epochs=3", "trainer.enable_progress_bar=true",
            f"tracking.artifact_root={tmp_path}/artifacts", f"tracking.checkpoint_root={tmp_path}/checkpoints"]  # fmt: skip
    make = subprocess.Popen(["make", "train", "TASK=task1", f"ARGS={shlex.join(args)}"], cwd=REPO, env=run_env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    lines = []
    for line in make.stdout:  # the first epoch's line is written once its checkpoint is: stop during the second
        lines.append(line)
        if line.startswith("epoch 0/2"):
            make.send_signal(signal.SIGTERM)  # what `timeout -s TERM` sends
            break
    output = "".join(lines) + make.stdout.read()
    assert make.wait(timeout=300) != 0, output[-3000:]
    stopped = STOPPED.search(output)
    assert stopped, output[-3000:]
    run_id, command = stopped.groups()
    client = MlflowClient(run_env["MLFLOW_TRACKING_URI"])
    assert client.get_run(run_id).info.status == "KILLED"
    assert f"resume={run_id}" in command and "trainer.max_epochs=3" in command

    resumed = subprocess.run(["bash", "-c", command], cwd=REPO, env=run_env, capture_output=True, text=True,
                             timeout=600)  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    (run,) = client.search_runs([client.get_experiment_by_name("task1").experiment_id])
    assert (run.info.run_id, run.info.status) == (run_id, "FINISHED")
    assert [m.step for m in client.get_metric_history(run_id, "val/mAP")] == [0, 1, 2]
