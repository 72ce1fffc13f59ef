"""Training stages: how a model is initialised before ``fit``. ``configs/stage/<name>.yaml`` picks one.

``crt`` is decoupled classifier re-training (Kang et al. 2020): the backbone of a finished run is frozen and only
a fresh head is trained with class-balanced sampling, so the head stops favouring the classes the
instance-balanced first stage saw most.
"""

from __future__ import annotations

import logging

from training.models.heads import reset_head
from training.runs import load_finished

log = logging.getLogger(__name__)


class Stage:
    """Prepares a freshly built model and says how its run relates to others."""

    def prepare(self, model, client) -> None:
        """Initialise ``model`` (a ``MultiLabelClassifier``) before training; ``client`` is an ``MlflowClient``."""

    def tags(self) -> dict[str, str]:
        return {"cxrlt.stage": "scratch"}


class FromScratch(Stage):
    """Train everything from the backbone's own initialisation (random, or ImageNet with model.pretrained)."""


class ClassifierRetraining(Stage):
    """cRT: load a finished run's best checkpoint, freeze its backbone, train a re-initialised head.

    The new run is nested under the first in MLflow and tagged ``cxrlt.stage=crt``; ``reinit_head=False``
    fine-tunes the old head instead.
    """

    def __init__(self, parent_run: str, reinit_head: bool = True):
        if not parent_run:
            raise ValueError("stage=crt needs the first stage's run id: stage.parent_run=<run id> (make crt RUN=<id>)")
        self.parent_run = str(parent_run)
        self.reinit_head = reinit_head

    def prepare(self, model, client) -> None:
        state = load_finished(self.parent_run, client).network.state_dict()
        backbone = {k.removeprefix("backbone."): v for k, v in state.items() if k.startswith("backbone.")}
        model.backbone.load_state_dict(backbone)
        if not self.reinit_head:
            model.head.load_state_dict({k.removeprefix("head."): v for k, v in state.items() if k.startswith("head.")})
        else:
            reset_head(model.head)
        model.freeze_backbone()
        log.info(
            "cRT: backbone of run %s frozen, head %s", self.parent_run, "re-initialised" if self.reinit_head else "kept"
        )

    def tags(self) -> dict[str, str]:
        return {"cxrlt.stage": "crt", "mlflow.parentRunId": self.parent_run, "cxrlt.parent_run": self.parent_run}
