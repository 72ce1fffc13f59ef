"""``make server`` installs nothing: without PostgreSQL it stops with one line naming what to install."""

from __future__ import annotations

import subprocess

import pytest

import training.tracking.server as server


def test_without_postgresql_make_server_names_the_package_and_writes_nothing(monkeypatch, tmp_path):
    monkeypatch.setattr(server, "DEBIAN_PG_ROOT", tmp_path / "no-postgresql")
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # no initdb on PATH either
    monkeypatch.setenv(server.ADMIN_PASSWORD_ENV, "Adm1n-test-pw-7c1f")
    monkeypatch.delenv("PGDATA", raising=False)

    def no_commands(*args, **kwargs):
        raise AssertionError(f"make server ran a command without PostgreSQL: {args}")

    monkeypatch.setattr(subprocess, "run", no_commands)
    monkeypatch.setattr(subprocess, "Popen", no_commands)
    folder = tmp_path / "server"
    with pytest.raises(SystemExit) as stopped:
        server.main(["--dir", str(folder), "--setup-only"])
    message = str(stopped.value)
    assert message.startswith("make server: ") and "\n" not in message
    assert "initdb" in message and "apt-get install postgresql" in message
    assert not folder.exists()  # no password file, no cluster folder, no config
