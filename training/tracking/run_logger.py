"""Lightning's MLflow logger, kept open until the pipeline closes the run and buffering through a server outage.

During fitting, epoch metrics that cannot reach a tracking server are buffered, in memory and in
``<checkpoint_dir>/unsent_metrics.json``, and sent, in order, at the first epoch the server answers again, so
training never stops for the server and a later ``resume`` can send what this process could not.
"""

from __future__ import annotations

import json
import logging
import re
import time
from argparse import Namespace
from collections.abc import Callable
from pathlib import Path

from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.utilities import rank_zero_only

from training.tracking import health
from training.tracking.health import is_remote
from training.tracking.redaction import redact, redact_text

log = logging.getLogger(__name__)


UNSENT_FILE = "unsent_metrics.json"


#: Characters MLflow refuses in metric names (Lightning's ``MLFlowLogger`` strips them the same way).
METRIC_NAME = re.compile(r"[^a-zA-Z0-9_/. -]+")


class RunLogger(MLFlowLogger):
    """An ``MLFlowLogger`` whose run stays open until the pipeline closes it, and outlives a tracking outage.

    Lightning finalises the logger after ``fit`` and after ``test``, but the platform still tests and uploads
    after ``fit``, so the terminal status is set once, by :meth:`TrackingSession.close`.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.unsent: list = []
        self.spool: Path | None = None
        self._outage_logged = False
        #: Some of :attr:`unsent` may have reached the server already: a send failed mid-way (the server stored
        #: the batch but the answer was lost), or a previous process died between sending and clearing its spool.
        self._maybe_delivered = False
        #: ``(key, epoch)`` pairs the run already holds when it is resumed (see :meth:`remember_logged`).
        self.logged_steps: set[tuple[str, int]] = set()
        #: With several validations per epoch (``trainer.val_check_interval``) two of one epoch would share the
        #: epoch as their step; then this returns the step to log against instead (the trainer's optimizer step,
        #: which a kept checkpoint records too; Lightning's own ``step`` for validation lags it by one).
        self.step_of: Callable[[], int] | None = None

    def remember_logged(self) -> None:
        """Note every ``(key, step)`` the resumed run already holds, so no value is logged twice (:meth:`not_logged`).

        Lightning may re-run the end of the checkpoint's epoch on resume, and a run killed in its test phase runs it
        again; the run keeps the value it has (the same one: the test is a function of the kept checkpoint).
        """
        client, run_id = self.experiment, self.run_id
        for key in client.get_run(run_id).data.metrics:
            self.logged_steps.update((key, m.step) for m in client.get_metric_history(run_id, key))

    def not_logged(self, metrics: dict, step: int) -> dict:
        """``metrics`` without the values the resumed run already holds at ``step``: every value the run logs, per
        epoch or once (``best_epoch``, ``test/...``), goes through here, so a resume after a kill in any phase logs
        each ``(key, step)`` once."""
        return {k: v for k, v in metrics.items() if (k, step) not in self.logged_steps}

    def finalize(self, status: str = "success") -> None:
        """Ignore Lightning's per-stage finalisation (see class docstring)."""

    @rank_zero_only
    def log_hyperparams(self, params) -> None:
        """Lightning logs the module's constructor arguments (``model_cfg/...``) as params of their own: they are
        redacted like the config's, or ``+model.hub_token=...`` would reach the run in clear as ``model_cfg/hub_token``."""
        super().log_hyperparams(redact(vars(params) if isinstance(params, Namespace) else dict(params)))

    def log_metrics(self, metrics, step=None) -> None:
        """Log with the epoch as MLflow's step (or :attr:`step_of`'s); buffer instead while a tracking server is
        unreachable.

        Epoch-level only (step-level values would be re-logged after a resume), so the epoch is the MLflow x axis;
        Lightning's extra ``epoch`` pseudo-metric is dropped.
        """
        metrics = dict(metrics)
        epoch = metrics.pop("epoch", None)
        if self.step_of is not None:
            step = self.step_of()
        elif epoch is not None:
            step = int(epoch)
        metrics = self.not_logged(metrics, step or 0)
        if not metrics:
            return
        if not is_remote(self._tracking_uri or ""):
            super().log_metrics(metrics, step)
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.unsent.extend(
            Metric(METRIC_NAME.sub("", k), float(v), now, step or 0)
            for k, v in metrics.items()
            if not isinstance(v, str)
        )  # the same filtering as MLFlowLogger.log_metrics
        self.flush()

    def flush(self) -> bool:
        """Send the buffered metrics if the server answers; returns whether nothing is left unsent.

        The buffer is mirrored to :attr:`spool` while not empty, so a process killed during the outage leaves its
        metrics for ``resume``. Idempotent: after a failed attempt, values the server already holds (same key, step and
        original timestamp) are dropped first, so no epoch is logged twice.
        """
        if not self.unsent:
            return True
        reason = health.server_reachable(self._tracking_uri)
        if reason is None:
            try:
                if self._maybe_delivered:
                    self._drop_delivered()
                send_metrics(self.experiment, self.run_id, self.unsent)
                self._maybe_delivered = False
            except Exception as error:  # noqa: BLE001 - the server went away between the probe and the send
                self._maybe_delivered = True
                reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        if reason is None:
            if self._outage_logged:
                log.warning("tracking server back: sent %d buffered metric values of run %s", len(self.unsent),
                            self._run_id)  # fmt: skip
            self.unsent.clear()
            self._outage_logged = False
            if self.spool is not None:
                self.spool.unlink(missing_ok=True)
            return True
        if not self._outage_logged:
            log.warning("tracking server %s unreachable (%s): buffering the metrics of run %s; training goes on",
                        redact_text(self._tracking_uri), reason, self._run_id)  # fmt: skip
            self._outage_logged = True
        self.save_unsent()
        return False

    def _drop_delivered(self) -> None:
        keys = {m.key for m in self.unsent}
        held = {(m.key, m.step, m.timestamp) for k in keys for m in self.experiment.get_metric_history(self.run_id, k)}
        self.unsent = [m for m in self.unsent if (m.key, m.step, m.timestamp) not in held]

    def save_unsent(self) -> None:
        """Mirror the buffer to :attr:`spool` (written whole, then renamed, so it is never half a file)."""
        if self.spool is None:
            return
        self.spool.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.spool.with_suffix(".tmp")
        tmp.write_text(json.dumps([[m.key, m.value, m.timestamp, m.step] for m in self.unsent]))
        tmp.replace(self.spool)

    def load_unsent(self) -> int:
        """Put a previous process's unsent metrics (from :attr:`spool`) back in the buffer; returns how many."""
        if self.spool is None or not self.spool.is_file():
            return 0
        from mlflow.entities import Metric

        loaded = [Metric(k, float(v), int(t), int(s)) for k, v, t, s in json.loads(self.spool.read_text())]
        self.unsent[:0] = loaded
        self._maybe_delivered = True  # the previous process may have sent some before it died
        return len(loaded)


def log_metric_batch(client, run_id: str, metrics: dict[str, float], step: int = 0) -> None:
    """``log_batch`` in chunks of MLflow's 1,000-metric limit, one timestamp for all."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    send_metrics(client, run_id, [Metric(key, float(value), now, step) for key, value in metrics.items()])


def send_metrics(client, run_id: str, items: list) -> None:
    """``log_batch`` of MLflow ``Metric`` entities in chunks of MLflow's 1,000-metric limit."""
    for start in range(0, len(items), 1000):
        client.log_batch(run_id, metrics=items[start : start + 1000])
