"""Commands on a tracking server that does not answer: one line naming the server, password masked, within
seconds (the health probe's 5 s timeout), instead of MLflow's client retrying for minutes."""

import os
import socket
import subprocess

import pytest

from tests.conftest import PROJECT_ROOT, free_port

pytestmark = pytest.mark.e2e  # the commands as typed: make test-e2e


@pytest.fixture
def silent_server():
    """A port that accepts connections and never answers, like a hung server."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield listener.getsockname()[1]


@pytest.mark.parametrize("command", [("register", "TASK=task1"), ("evaluate", "RUN=abc"), ("submit", "TASK=task1")])
@pytest.mark.parametrize("server", ["refused", "silent"])
def test_a_command_on_a_server_that_does_not_answer_is_one_line_naming_it(command, server, request):
    port = request.getfixturevalue("silent_server") if server == "silent" else free_port()
    uri = f"http://user:s3cret-pw@127.0.0.1:{port}"
    done = subprocess.run(["make", "--no-print-directory", "-C", str(PROJECT_ROOT), *command],
                          env={**os.environ, "MLFLOW_TRACKING_URI": uri}, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode != 0 and "Traceback" not in out and "s3cret-pw" not in out, out[-3000:]
    named = [
        line for line in out.splitlines() if f"tracking server http://user:***@127.0.0.1:{port} is unreachable" in line
    ]
    assert len(named) == 1, out[-3000:]
