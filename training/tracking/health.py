"""Is the tracking server there? Asked before anything is created, so a wrong URI fails in seconds.

Only http(s) tracking URIs are asked (a local SQLite store cannot go away); a stopped server gives
:class:`TrackingUnavailable` instead of MLflow's client retrying for minutes.
"""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request

from training.errors import UserError
from training.tracking.redaction import redact_text

#: Seconds the ``/health`` probe waits: long enough for a busy server, short enough to fail fast.
HEALTH_TIMEOUT_S = 5.0


class TrackingUnavailable(UserError, RuntimeError):
    """The tracking server does not answer; the message names the server, the run (if any) and what to do."""


def is_remote(uri: str) -> bool:
    """Whether ``uri`` is a tracking server (which can go away), not a local store."""
    return uri.startswith(("http://", "https://"))


def server_reachable(uri: str, timeout: float = HEALTH_TIMEOUT_S) -> str | None:
    """``None`` when ``<uri>/health`` answers 200 within ``timeout``, else why not (for the error message).

    ``/health`` needs no credentials even with basic auth on, so this tells "server gone" apart from "wrong
    password" (which MLflow's client reports itself, at once, as a 401).
    """
    parts = urllib.parse.urlsplit(uri)
    bare = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()  # credentials are not urllib's to parse
    try:
        with urllib.request.urlopen(bare.rstrip("/") + "/health", timeout=timeout) as response:
            return None if response.status == 200 else f"/health answered {response.status}"
    except urllib.error.HTTPError as error:
        return f"/health answered {error.code}"
    except (OSError, ValueError) as error:  # refused, timeout, DNS, malformed URL
        return str(getattr(error, "reason", error))


def check_reachable(uri: str, timeout: float = HEALTH_TIMEOUT_S) -> None:
    """Fail fast with a clear message when a tracking server ``uri`` does not answer (local stores pass).

    Raises:
        TrackingUnavailable: the server did not answer its health check within ``timeout`` seconds.
    """
    if not is_remote(uri):
        return
    reason = server_reachable(uri, timeout)
    if reason is not None:
        raise TrackingUnavailable(
            f"tracking server {redact_text(uri)} is unreachable ({reason}); nothing was logged. Start it "
            "(`make server`) or point MLFLOW_TRACKING_URI at a running one."
        )
