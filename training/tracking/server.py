"""The team tracking server: PostgreSQL setup and ``mlflow server`` with basic authentication (``make server``).

One module does what ``make server`` and the server tests both need, so the tests start the server exactly as a
team would:

* :class:`PostgresCluster` initialises a cluster in a folder of our choosing (``initdb``), starts it on one port
  and creates the role and databases. It installs nothing: installing system packages is the user's (or CI's) job,
  so without PostgreSQL's server binaries ``make server`` stops with one line saying what to install. A PostgreSQL
  server refuses to run as root, so when we are root every PostgreSQL command runs as the ``postgres`` system user
  (``runuser``) and the cluster folder belongs to it.
* :func:`prepare_server` writes what the server needs into a git-ignored folder, each file mode 0600: the MLflow
  basic-auth config (auth user database and admin user, with the admin password taken from
  ``MLFLOW_ADMIN_PASSWORD``), a libpq password file (so no database password is ever on a command line or in a
  URL that MLflow could echo), and the Flask secret key the auth app needs for CSRF protection.
* :func:`server_command` is the ``mlflow server`` command line: PostgreSQL backend store, served artifacts
  (clients upload and download through the server, never touching its disk), ``--app-name basic-auth``, bound to
  127.0.0.1 unless a host is given.
* :func:`pool_env` sizes each worker's database connection pools for every request the worker can run at once
  (see :data:`WORKER_THREADS`), and :func:`max_connections` what PostgreSQL must accept for that.

Command line (what ``make server`` runs)::

    MLFLOW_ADMIN_PASSWORD=... python -m training.tracking.server [--host 127.0.0.1] [--port 5000]
        [--dir mlruns/server] [--pg-port 5432] [--database-url postgresql://mlflow@db-host:5432/mlflow]

Without ``--database-url`` a local cluster is created (once) under ``<dir>/pgdata``; with it, the role and
databases are expected to exist (see docs/scaling.md, "A team tracking server") and the password comes from
``PGPASSWORD`` or the user's ``~/.pgpass``.
"""

from __future__ import annotations

import argparse
import configparser
import logging
import os
import secrets
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

log = logging.getLogger(__name__)

#: Where the admin password is read from; ``make server`` refuses to start without it.
ADMIN_PASSWORD_ENV = "MLFLOW_ADMIN_PASSWORD"
ADMIN_USERNAME_ENV = "MLFLOW_ADMIN_USERNAME"
#: The database role's password; generated once (and kept in ``<dir>/db_password``) when unset.
DB_PASSWORD_ENV = "MLFLOW_DB_PASSWORD"
PG_OS_USER = "postgres"
ROLE = "mlflow"
TRACKING_DB = "mlflow"
AUTH_DB = "mlflow_auth"

#: Requests one ``mlflow server`` worker runs at once. uvicorn hands every request to MLflow's Flask app on a thread
#: of anyio's default limiter (``anyio.to_thread.run_sync``: 40 threads), and the auth middleware of the FastAPI
#: routes checks passwords on the event loop's own thread (one more). Each holds at most one connection of a store
#: at a time, so a pool this large never makes a request wait. MLflow's default (SQLAlchemy's 5 + 10 overflow) makes
#: the 16th concurrent request wait, 30 s at most, then fail with HTTP 400 "QueuePool limit of size 5 overflow 10
#: reached", which MLflow's client does not retry: a burst of metric writes would lose some.
WORKER_THREADS = 40 + 1
#: Connections a pool keeps open while idle; the rest, up to :data:`WORKER_THREADS`, are opened for a burst only.
POOL_SIZE = 5
#: Connection pools of a worker: the tracking and model-registry stores (each its own, on the tracking database)
#: and the auth app's (on the auth database).
POOLS_PER_WORKER = 3
#: Connections left for everything else on the cluster: psql, Optuna workers on a study database, a second server.
RESERVED_CONNECTIONS = 50
#: Seconds a worker trusts a credential it has checked. MLflow's basic auth otherwise runs a scrypt check (about
#: 0.1 s of server CPU) on every request, and a training logs through many; the cost of trusting: a password changed
#: or a user deleted through one worker is still accepted by the other workers until this has passed. 0 turns it off.
AUTH_CACHE_TTL_S = 60
POOL_SIZE_ENV = "MLFLOW_SQLALCHEMYSTORE_POOL_SIZE"
MAX_OVERFLOW_ENV = "MLFLOW_SQLALCHEMYSTORE_MAX_OVERFLOW"


class ServerSetupError(RuntimeError):
    """The server cannot be set up; the message says what is missing and how to fix it."""


def write_secret(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` readable by its owner only (created 0600, never world-readable for a moment)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.chmod(path, 0o600)  # an existing file keeps its old mode through O_CREAT
    return path


def _as_root() -> bool:
    return os.geteuid() == 0


#: Where Debian and Ubuntu keep each PostgreSQL version's server binaries (only client wrappers are on PATH).
DEBIAN_PG_ROOT = Path("/usr/lib/postgresql")
INSTALL_HINT = "install PostgreSQL's server (Debian/Ubuntu: sudo apt-get install postgresql)"


def pg_bin_dir() -> Path:
    """Folder of ``initdb``/``pg_ctl``: Debian's newest version, else the one on PATH.

    Raises:
        ServerSetupError: no ``initdb`` was found; the message says what to install.
    """
    candidates = sorted(DEBIAN_PG_ROOT.glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    if candidates:
        return candidates[-1].parent
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).parent
    raise ServerSetupError(f"PostgreSQL's initdb was found neither under {DEBIAN_PG_ROOT} nor on PATH: {INSTALL_HINT}")


@dataclass
class PostgresCluster:
    """A PostgreSQL cluster owned by this deployment: its folder, port and listening address.

    Local (Unix-socket) connections are trusted, but the socket lives inside the cluster folder (mode 0700), so
    only the cluster's owner can use it; TCP connections need a password (scram-sha-256).
    """

    datadir: Path
    port: int = 5432
    host: str = "127.0.0.1"
    bin_dir: Path = field(default_factory=pg_bin_dir)
    #: PostgreSQL's own default; :func:`main` raises it to what the server's workers may open (``max_connections``).
    max_connections: int = 100

    def _run(self, *cmd: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
        """Run a PostgreSQL program, as the ``postgres`` system user when we are root (PostgreSQL refuses root)."""
        argv = [str(self.bin_dir / cmd[0]), *cmd[1:]]
        if _as_root():
            argv = ["runuser", "-u", PG_OS_USER, "--", *argv]
        result = subprocess.run(argv, capture_output=True, text=True, **kwargs)
        if check and result.returncode != 0:
            raise ServerSetupError(f"{cmd[0]} failed ({result.returncode}): {result.stderr.strip()[-2000:]}")
        return result

    def init(self) -> None:
        """``initdb`` the folder unless it already holds a cluster."""
        if (self.datadir / "PG_VERSION").is_file():
            return
        self.datadir.mkdir(parents=True, exist_ok=True)
        if _as_root():
            shutil.chown(self.datadir, PG_OS_USER, PG_OS_USER)
            probe = subprocess.run(["runuser", "-u", PG_OS_USER, "--", "test", "-w", str(self.datadir)])
            if probe.returncode != 0:
                raise ServerSetupError(f"the {PG_OS_USER} system user cannot reach {self.datadir} (a parent folder "
                                       "is not traversable); choose another folder with PGDATA=...")  # fmt: skip
        os.chmod(self.datadir, 0o700)
        self._run("initdb", "-D", str(self.datadir), "-U", "postgres", "--auth-local=trust",
                  "--auth-host=scram-sha-256", "--encoding=UTF8", "--no-instructions")  # fmt: skip

    def running(self) -> bool:
        return self._run("pg_ctl", "status", "-D", str(self.datadir), check=False).returncode == 0

    def start(self) -> None:
        """Start the cluster on ``host:port`` (a no-op when it is already running) and wait until it accepts."""
        if self.running():
            return
        options = f"-p {self.port} -k {self.datadir} -c listen_addresses={self.host} -c max_connections={self.max_connections}"
        self._run("pg_ctl", "start", "-D", str(self.datadir), "-w", "-t", "60", "-l",
                  str(self.datadir / "server.log"), "-o", options)  # fmt: skip

    def stop(self) -> None:
        if self.running():
            self._run("pg_ctl", "stop", "-D", str(self.datadir), "-m", "fast", "-w")

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run SQL as the cluster's superuser over the private Unix socket; returns the unaligned output."""
        result = self._run("psql", "-h", str(self.datadir), "-p", str(self.port), "-U", "postgres", "-d", database,
                           "-v", "ON_ERROR_STOP=1", "-At", "-c", sql)  # fmt: skip
        return result.stdout.strip()

    def ensure_role_and_databases(self, role: str, password: str, databases: tuple[str, ...]) -> None:
        """Create (or re-password) the login role and create each database it owns, idempotently."""
        literal = "'" + password.replace("'", "''") + "'"
        exists = self.psql(f"SELECT 1 FROM pg_roles WHERE rolname = '{role}'")
        verb = "ALTER" if exists else "CREATE"
        self.psql(f'{verb} ROLE "{role}" WITH LOGIN PASSWORD {literal}')
        for name in databases:
            if not self.psql(f"SELECT 1 FROM pg_database WHERE datname = '{name}'"):
                self.psql(f'CREATE DATABASE "{name}" OWNER "{role}"')

    def url(self, role: str, database: str) -> str:
        """SQLAlchemy URL without the password (libpq reads it from ``PGPASSFILE``)."""
        return f"postgresql://{quote(role)}@{self.host}:{self.port}/{database}"


@dataclass
class ServerFiles:
    """What :func:`prepare_server` wrote: the paths and the environment the ``mlflow server`` process needs."""

    auth_config: Path
    pgpass: Path | None
    backend_uri: str
    artifacts: Path
    env: dict[str, str]


def local_database(server_dir: Path, pg_port: int, connections: int = 100) -> tuple[PostgresCluster, str, str]:
    """Initialise and start the deployment's own cluster; returns it and the tracking and auth database URLs.

    The role's password comes from ``MLFLOW_DB_PASSWORD`` or is generated once and kept (0600) beside the
    cluster, so restarting ``make server`` keeps working without anyone typing it. The cluster accepts
    ``connections`` clients; one already running with fewer is kept (restarting it would cut off its other users)
    and the log says so.
    """
    bin_dir = pg_bin_dir()  # before anything is written: without PostgreSQL nothing is left behind
    password = os.environ.get(DB_PASSWORD_ENV)
    stored = server_dir / "db_password"
    if not password:
        password = stored.read_text().strip() if stored.is_file() else secrets.token_urlsafe(24)
    write_secret(stored, password)
    cluster = PostgresCluster(Path(os.environ.get("PGDATA") or server_dir / "pgdata").resolve(), pg_port,
                              bin_dir=bin_dir, max_connections=connections)  # fmt: skip
    cluster.init()
    cluster.start()
    accepted = int(cluster.psql("SHOW max_connections"))
    if accepted < connections:
        log.warning("PostgreSQL (already running) accepts %d connections, the server's workers may open %d: "
                    "restart it (pg_ctl stop -D %s) so make server starts it with enough", accepted, connections,
                    cluster.datadir)  # fmt: skip
    cluster.ensure_role_and_databases(ROLE, password, (TRACKING_DB, AUTH_DB))
    return cluster, cluster.url(ROLE, TRACKING_DB), cluster.url(ROLE, AUTH_DB)


def _pgpass_line(url: str, password: str) -> str:
    parts = urlsplit(url)
    fields = [parts.hostname or "localhost", str(parts.port or 5432), parts.path.lstrip("/") or "*",
              parts.username or "*", password]  # fmt: skip
    return ":".join(f.replace("\\", "\\\\").replace(":", "\\:") for f in fields) + "\n"


def require_admin_password() -> str:
    """The admin password from ``MLFLOW_ADMIN_PASSWORD``; checked before anything is created."""
    admin_password = os.environ.get(ADMIN_PASSWORD_ENV)
    if not admin_password:
        raise ServerSetupError(f"{ADMIN_PASSWORD_ENV} is not set: export the tracking server's admin password in "
                               "this variable (it is never stored in the repository)")  # fmt: skip
    return admin_password


def prepare_server(server_dir: Path, backend_uri: str, auth_uri: str, db_password: str | None,
                   artifacts: Path | None = None, auth_cache_ttl: int = AUTH_CACHE_TTL_S) -> ServerFiles:  # fmt: skip
    """Write the 0600 auth config, libpq password file and secret key; return the server's environment.

    Raises:
        ServerSetupError: ``MLFLOW_ADMIN_PASSWORD`` is unset or empty, or a database URL carries its password
            inline (it would end up in process listings and logs).
    """
    admin_password = require_admin_password()
    for url in (backend_uri, auth_uri):
        if urlsplit(url).password:
            raise ServerSetupError("give the database password by PGPASSWORD or ~/.pgpass, not inside the URL "
                                   f"{url.split('@')[-1]}")  # fmt: skip
    server_dir = server_dir.resolve()
    server_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(server_dir, 0o711)  # others may traverse (the postgres user to pgdata/), never list
    config = configparser.ConfigParser(interpolation=None)
    config["mlflow"] = {
        "default_permission": "READ",  # any authenticated user reads; writing another's run needs a grant
        "database_uri": auth_uri,
        "admin_username": os.environ.get(ADMIN_USERNAME_ENV) or "admin",
        "admin_password": admin_password,
        "authorization_function": "mlflow.server.auth:authenticate_request_basic_auth",
        "auth_cache_ttl_seconds": str(auth_cache_ttl),
    }
    auth_config = server_dir / "basic_auth.ini"
    fd = os.open(auth_config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        config.write(handle)
    os.chmod(auth_config, 0o600)
    key_file = server_dir / "flask_secret_key"
    if not key_file.is_file():  # static across restarts and workers, as the auth app's CSRF check requires
        write_secret(key_file, secrets.token_hex(32))
    env = {
        "MLFLOW_AUTH_CONFIG_PATH": str(auth_config),
        "MLFLOW_FLASK_SERVER_SECRET_KEY": key_file.read_text().strip(),
    }
    pgpass = None
    if db_password:
        pgpass = write_secret(server_dir / "pgpass", _pgpass_line(backend_uri, db_password) +
                              _pgpass_line(auth_uri, db_password))  # fmt: skip
        env["PGPASSFILE"] = str(pgpass)
    artifacts = (artifacts or server_dir / "artifacts").resolve()
    artifacts.mkdir(parents=True, exist_ok=True)
    return ServerFiles(auth_config, pgpass, backend_uri, artifacts, env)


def server_command(files: ServerFiles, host: str = "127.0.0.1", port: int = 5000, workers: int = 2) -> list[str]:
    """The ``mlflow server`` command line (no secret on it: those travel in the environment and 0600 files)."""
    mlflow = Path(sys.executable).with_name("mlflow")
    return [
        str(mlflow) if mlflow.exists() else "mlflow", "server",
        "--backend-store-uri", files.backend_uri,
        "--serve-artifacts", "--artifacts-destination", files.artifacts.as_uri(),
        "--app-name", "basic-auth",
        "--host", host, "--port", str(port), "--workers", str(workers),
    ]  # fmt: skip


def pool_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """MLflow's pool variables sized so no request of a worker ever waits for a connection (:data:`WORKER_THREADS`).

    Values already in ``environ`` are the operator's and are kept; ones too small for that are logged, since
    requests beyond them can fail under load.
    """
    environ = os.environ if environ is None else environ
    env = {POOL_SIZE_ENV: environ.get(POOL_SIZE_ENV) or str(POOL_SIZE),
           MAX_OVERFLOW_ENV: environ.get(MAX_OVERFLOW_ENV) or str(WORKER_THREADS - POOL_SIZE)}  # fmt: skip
    total = pool_connections(env)
    if total < WORKER_THREADS:
        log.warning("%s + %s = %d connections per pool, fewer than the %d requests a worker runs at once: requests "
                    "beyond them wait and can fail with 'QueuePool limit ... reached'", POOL_SIZE_ENV,
                    MAX_OVERFLOW_ENV, total, WORKER_THREADS)  # fmt: skip
    return env


def pool_connections(pool: dict[str, str]) -> int:
    """Connections one pool opens at most under ``pool``'s variables, read as MLflow reads them (0 means unset)."""
    try:
        size, overflow = int(pool[POOL_SIZE_ENV]), int(pool[MAX_OVERFLOW_ENV])
    except ValueError as error:
        raise ServerSetupError(f"{POOL_SIZE_ENV} and {MAX_OVERFLOW_ENV} must be whole numbers: {error}") from error
    return (size or 5) + (overflow or 10)  # SQLAlchemy's defaults, which MLflow leaves in place for a 0


def max_connections(workers: int, pool: dict[str, str] | None = None) -> int:
    """Connections PostgreSQL must accept: every pool of every worker full, plus :data:`RESERVED_CONNECTIONS`."""
    return workers * POOLS_PER_WORKER * pool_connections(pool_env() if pool is None else pool) + RESERVED_CONNECTIONS


def server_env(files: ServerFiles, pool: dict[str, str] | None = None) -> dict[str, str]:
    """The server process's environment: ours, plus the auth and pool settings, minus the admin password variable.

    The admin password is read from the 0600 config file; dropping the variable keeps it out of the server's
    (and its workers') environment.
    """
    env = {k: v for k, v in os.environ.items() if k not in (ADMIN_PASSWORD_ENV, DB_PASSWORD_ENV)}
    return {**env, **(pool_env() if pool is None else pool), **files.env}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m training.tracking.server", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--dir", type=Path, default=Path("mlruns/server"), help="generated config (git-ignored)")
    parser.add_argument("--artifacts", type=Path, default=None, help="artifact store folder (default <dir>/artifacts)")
    parser.add_argument("--pg-port", type=int, default=5432, help="port of the local PostgreSQL cluster")
    parser.add_argument("--database-url", default=None,
                        help="existing tracking database (postgresql://user@host:port/db); skips the local cluster")  # fmt: skip
    parser.add_argument("--auth-database-url", default=None, help="user database of the auth app (default: "
                        f"the tracking database's server, database {AUTH_DB})")  # fmt: skip
    parser.add_argument("--auth-cache-ttl", type=int, default=AUTH_CACHE_TTL_S,
                        help=f"seconds a worker trusts a checked password (default {AUTH_CACHE_TTL_S}; 0: check each request)")  # fmt: skip
    parser.add_argument("--setup-only", action="store_true", help="prepare database and config, do not serve")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if args.workers < 1:
            raise ServerSetupError(f"--workers must be at least 1, not {args.workers}")
        if args.auth_cache_ttl < 0:
            raise ServerSetupError(f"--auth-cache-ttl must be 0 or more seconds, not {args.auth_cache_ttl}")
        pool = pool_env()
        connections = max_connections(args.workers, pool)
        if args.database_url:
            backend = args.database_url
            auth = args.auth_database_url or urlunsplit(urlsplit(backend)._replace(path=f"/{AUTH_DB}"))
            db_password = os.environ.get("PGPASSWORD")  # else libpq's own ~/.pgpass
            log.info("the database must accept up to %d connections (max_connections) for %d workers", connections,
                     args.workers)  # fmt: skip
        else:
            require_admin_password()  # before a cluster is created for nothing
            _, backend, auth = local_database(args.dir, args.pg_port, connections=connections)
            db_password = (args.dir / "db_password").read_text().strip()
        files = prepare_server(args.dir, backend, auth, db_password, args.artifacts, args.auth_cache_ttl)
    except ServerSetupError as error:
        sys.exit(f"make server: {error}")
    command = server_command(files, args.host, args.port, args.workers)
    if args.setup_only:
        print(" ".join(command))
        return
    log.info("serving http://%s:%d (backend %s, artifacts %s, basic auth on)", args.host, args.port, backend,
             files.artifacts)  # fmt: skip
    os.execve(command[0] if os.path.isabs(command[0]) else shutil.which(command[0]), command, server_env(files, pool))


if __name__ == "__main__":
    main()
