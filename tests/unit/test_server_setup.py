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


@pytest.mark.parametrize(("args", "ttl"), [([], server.AUTH_CACHE_TTL_S), (["--auth-cache-ttl", "0"], 0)])
def test_the_auth_config_make_server_writes_sets_mlflows_credential_cache(monkeypatch, tmp_path, args, ttl):
    """Read back by MLflow's own reader, as the server's auth app reads it at start."""
    from mlflow.server.auth.config import read_auth_config

    monkeypatch.setenv(server.ADMIN_PASSWORD_ENV, "Adm1n-test-pw-7c1f")
    folder = tmp_path / "server"
    server.main(["--dir", str(folder), "--setup-only", "--database-url", "postgresql://mlflow@db-host:5432/mlflow",
                 *args])  # fmt: skip
    monkeypatch.setenv("MLFLOW_AUTH_CONFIG_PATH", str(folder / "basic_auth.ini"))
    config = read_auth_config()
    assert config.auth_cache_ttl_seconds == ttl and server.AUTH_CACHE_TTL_S > 0
    assert config.database_uri == "postgresql://mlflow@db-host:5432/mlflow_auth"


def test_a_negative_credential_cache_time_is_one_line_and_writes_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv(server.ADMIN_PASSWORD_ENV, "Adm1n-test-pw-7c1f")
    folder = tmp_path / "server"
    with pytest.raises(SystemExit) as stopped:
        server.main(["--dir", str(folder), "--setup-only", "--auth-cache-ttl", "-1"])
    assert str(stopped.value) == "make server: --auth-cache-ttl must be 0 or more seconds, not -1"
    assert not folder.exists()
