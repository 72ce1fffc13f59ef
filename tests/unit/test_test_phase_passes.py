"""The test phase runs the model over each split once: the plain test predictions are the TTA pass's identity view,
and the validation predictions the temperature fit's pass when no temperature is applied (issue 31). The numbers
are those of separate passes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from evaluation.test_phase import run_test_phase
from evaluation.tta import TTAPredictor
from tests.unit.test_heldout import LABELS, LeftRight, Sink, _datamodule


class CountingLeftRight(LeftRight):
    """``LeftRight`` with a temperature buffer, counting the images its forward sees."""

    def __init__(self):
        super().__init__()
        self.register_buffer("logit_temperature", torch.ones(len(LABELS)))
        self.images_seen = 0

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        self.images_seen += len(images)
        return super().forward(images) / self.logit_temperature


def _cfg(tta: bool, calibration: str | None) -> OmegaConf:
    evaluation = {"n_boot": 20, "seed": 0, "threshold": 0.5, "per_source": False, "per_class_metrics": True,
                  "plots": False, "perturbation": {"enabled": False}, "postprocess": [], "heldout": {"enabled": False}}  # fmt: skip
    cfg = {"evaluation": evaluation, "tta": {"enabled": tta, "views": ["hflip", "identity"], "merge": "mean"}}
    if calibration is not None:
        cfg["calibration"] = {"_target_": "evaluation.temperature.TemperatureFitter", "mode": calibration}
    return OmegaConf.create(cfg)


@pytest.mark.parametrize(("tta", "calibration"), [(True, None), (False, None), (True, "global")])
def test_each_split_is_predicted_once_and_as_separate_passes_would(make_manifest, tta, calibration):
    module = _datamodule(make_manifest(n=60, size=24, labels=LABELS))
    model = CountingLeftRight()
    evaluation, _ = run_test_phase(model, module, _cfg(tta, calibration), Sink())
    n_val, n_test = len(module.datasets["val"]), len(module.datasets["test"])
    applied = calibration is not None
    # 2 x 4: the check that the forward honours the temperature; validation again only when a temperature changed
    # the model after the fit; the test split once per TTA view (the identity view is the plain prediction)
    assert model.images_seen == 2 * 4 + n_val * (2 if applied else 1) + n_test * (2 if tta else 1)

    plain = TTAPredictor(["identity"])
    np.testing.assert_array_equal(evaluation.sets["test"].probs, plain.predict(model, module.eval_dataloader("test")))
    val = evaluation.predictions["val"][LABELS].to_numpy(np.float32)
    np.testing.assert_array_equal(val, plain.predict(model, module.eval_dataloader("val")))
    if tta:
        separate = TTAPredictor(["hflip", "identity"]).predict(model, module.eval_dataloader("test"))
        np.testing.assert_array_equal(evaluation.sets["test_tta"].probs, separate)
        assert not np.array_equal(separate, evaluation.sets["test"].probs)  # the flip does change the scores
