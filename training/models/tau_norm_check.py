"""What ``postprocess=tau_norm`` needs, checked when the fit starts rather than after hours of training.

The normalisation itself runs in the test phase (:mod:`evaluation.tau_norm`); only a plain linear head on the pooled
feature has the one weight vector per class it rescales, and ``tau`` is chosen by a validation suite metric.
"""

from __future__ import annotations

import lightning.pytorch as L

from evaluation.tau_norm import linear_head, suite_metric
from training.errors import UserError


class TauNormConfigError(UserError):
    """``postprocess=tau_norm`` with a head it cannot normalise or a metric it cannot tune by."""


class TauNormRequirements(L.Callback):
    """Refuses, in one line, a non-linear head or an unknown tuning metric before the first training step.

    Args:
        metric: ``postprocess.metric``, the validation metric ``tau`` is chosen by.
    """

    def __init__(self, metric: str):
        self.metric = metric

    def setup(self, trainer, pl_module, stage: str) -> None:
        try:
            suite_metric(self.metric)
            linear_head(pl_module)
        except ValueError as error:
            raise TauNormConfigError(str(error)) from None
