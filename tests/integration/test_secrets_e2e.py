"""Secrets typed on the real training command line never reach the run: params, tags and ``config.yaml``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from mlflow import MlflowClient

from tests.conftest import train_command
from training.tracking.redaction import REDACTED

#: Key -> secret, as a user types them (``+foo.authorization="Bearer ..."`` reaches Hydra without the quotes).
SECRETS = {
    "aws_secret_access_key": "wJalrXUtnFEMI-K7MDENG-bPxRfiCYzEXAMPLE",
    "authorization": "Bearer eyJhbGciOiJIUzI1NiJ9.c2VjcmV0.sig-e2e",
    "pw": "hunter2-e2e",
}
#: A bearer token under an ordinary key: caught by its value, not its name.
NOTE = "call the hub with Bearer hub-token-e2e-42"
#: An extra run tag (``+tags.<key>``, as ``make compare`` adds them) with a secret name.
TAG_SECRET = "tag-secret-e2e-7"


def test_secret_keys_and_bearer_values_are_blanked_in_params_tags_and_config_yaml(tmp_path, run_env):
    overrides = [f"+foo.{key}={value}" for key, value in SECRETS.items()]
    overrides += [f"+foo.note={NOTE}", f"+tags.hub_token={TAG_SECRET}"]
    done = subprocess.run(
        train_command(tmp_path, "debug=smoke", f"data.source.root={tmp_path}/synthetic", "trainer.enable_progress_bar=false",
                      "tta.enabled=false", "evaluation.perturbation.enabled=false", "evaluation.n_boot=20", *overrides),
        env=run_env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    client = MlflowClient(run_env["MLFLOW_TRACKING_URI"])
    (run,) = client.search_runs([client.get_experiment_by_name("task1").experiment_id])
    params = run.data.params
    for key in SECRETS:
        assert params[f"foo.{key}"] == REDACTED, key
    assert params["foo.note"] == f"call the hub with Bearer {REDACTED}"
    assert params["model.name"] == "regnetx_004"  # ordinary keys stay readable
    assert run.data.tags["cxrlt.hub_token"] == REDACTED

    config = Path(client.download_artifacts(run.info.run_id, "config.yaml", str(tmp_path))).read_text()
    for key in SECRETS:
        assert f"  {key}: '{REDACTED}'" in config, config[config.find("foo:") :][:400]
    everything = config + json.dumps(params) + json.dumps(run.data.tags) + done.stdout + done.stderr
    for secret in [*SECRETS.values(), "hub-token-e2e-42", TAG_SECRET]:
        assert secret.split()[-1] not in everything, secret
