"""Secrets typed on the real command line never leave the process: not the store, the artifacts, the checkpoints,
the registry, nor the terminal, through the commands a user types (``make train``, a failing training, ``make
register``)."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tests.conftest import PROJECT_ROOT
from training.tracking.redaction import REDACTED

pytestmark = pytest.mark.e2e  # trains through the real CLI: make test-e2e (docs/development.md)


def secret(index: int) -> str:
    return f"sekrit{index:02d}qx7"


#: Secret by the key's name: ``+foo.<key>=<secret>`` (the documented words: token, key, cred, pw, passwd, secret, auth...).
SECRET_KEYS = ["password", "passwd", "pw", "pwd", "db_pass", "secret", "client_secret", "api_key", "apiKey", "hub.key",
               "key", "cred", "creds", "credentials.user", "token", "access_token", "hf_token", "auth", "session_id",
               "cookie", "private_key", "jwt", "signature"]  # fmt: skip
#: Secret by the value's form, under ordinary keys; ``{}`` is where the secret goes. The first two sit in the model's
#: config, which Lightning logs (``model_cfg/...``) and saves in every checkpoint on its own.
VALUE_FORMS = {"+model.hub_token": "{}", "+model.weights_url": "https://hub.lan/w.pt?access_token={}",
               "+foo.mirror": "https://alice:{}@mirror.lan/x", "+foo.repo": "https://{}@git.lan/r.git",
               "+foo.note": "call the hub with Bearer {}", "+foo.authorization": "Bearer {}",
               "+tags.hub_token": "{}"}  # fmt: skip
#: Secret because an environment variable holds it: the value is blanked wherever it shows up.
ENV_SECRETS = {"DB_PW": "+foo.comment", "HF_TOKEN": "+foo.other"}


def forms() -> tuple[list[str], dict[str, str], list[str]]:
    """``(overrides, environment, secrets)``: 32 secret forms, each with its own value."""
    overrides, env, values = [], {}, []
    for key in SECRET_KEYS:
        values.append(secret(len(values)))
        overrides.append(f"+foo.{key}={values[-1]}")
    for key, form in VALUE_FORMS.items():
        values.append(secret(len(values)))
        overrides.append(f"{key}='{form.format(values[-1])}'")  # Hydra's quotes: the value has = : / ? @ or spaces
    for name, key in ENV_SECRETS.items():
        values.append(secret(len(values)))
        env[name] = values[-1]
        overrides.append(f"{key}=see-{values[-1]}")
    return overrides, env, values


SMOKE = ["debug=smoke", "trainer.enable_progress_bar=false", "tta.enabled=false",
         "evaluation.perturbation.enabled=false", "evaluation.n_boot=20", "evaluation.plots=false"]  # fmt: skip


def make(target: str, env: dict, **variables: str) -> subprocess.CompletedProcess:
    """``make <target> VAR=...`` as a user types it (setup taken as done), output captured."""
    command = ["make", "--no-print-directory", "-o", "setup", "-o", ".venv/.installed", target]
    command += [f"{name}={value}" for name, value in variables.items()]
    return subprocess.run(command, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=900)


def test_thirty_two_secret_forms_reach_no_file_and_no_terminal(tmp_path, run_env, smoke_data):
    overrides, secret_env, values = forms()
    assert len(values) >= 30
    env = {**run_env, **secret_env}
    paths = [f"tracking.artifact_root={tmp_path}/artifacts", f"tracking.checkpoint_root={tmp_path}/checkpoints",
             f"data.source.root={smoke_data[0]}"]  # fmt: skip
    args = shlex.join([*paths, *SMOKE, *overrides])
    trained = make("train", env, TASK="task1", ARGS=args)
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    # A failure Hydra reports itself repeats every override ("Error executing job with overrides: [...]").
    failed = make(
        "train", env, TASK="task1", ARGS=shlex.join([*paths, *SMOKE, *overrides, "trainer.accelerator=abacus"])
    )
    assert failed.returncode != 0 and "Error executing job with overrides" in failed.stdout + failed.stderr
    registered = make("register", env, TASK="task1", ARGS="--no-full-evaluation --include-debug")  # a smoke run
    assert registered.returncode == 0, registered.stdout[-3000:] + registered.stderr[-3000:]

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    (run,) = client.search_runs([client.get_experiment_by_name("task1").experiment_id])
    params = run.data.params
    assert params["foo.pw"] == params["foo.hub.key"] == params["model_cfg/hub_token"] == REDACTED
    assert params["model.weights_url"] == f"https://hub.lan/w.pt?access_token={REDACTED}"
    assert params["model.name"] == "regnetx_004"  # ordinary values stay readable
    assert client.get_model_version("cxrlt-task1", "1").run_id == run.info.run_id

    terminal = "".join(done.stdout + done.stderr for done in (trained, failed, registered))
    assert REDACTED in terminal  # the overrides were printed, blanked
    leaks = [(value, "terminal") for value in values if value in terminal]
    store = Path(env["MLFLOW_TRACKING_URI"].removeprefix("sqlite:///"))
    files = [store, *(path for path in tmp_path.rglob("*") if path.is_file() and path != store)]
    assert any(path.name == "best.ckpt" for path in files) and any(path.name == "spec.json" for path in files)
    for path in files:
        data = path.read_bytes()
        leaks += [(value, str(path.relative_to(tmp_path))) for value in values if value.encode() in data]
    assert not leaks, leaks
