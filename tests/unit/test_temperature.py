"""Temperature scaling: the fit recovers a known temperature, lowers ECE of an over-confident model, never changes a
class's ranking, and is written into (or kept out of) the model as configured."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from evaluation.report import _calibration_section, summary_lines
from evaluation.suite import compute_suite
from evaluation.temperature import (
    TemperatureFitter,
    TemperatureResult,
    calibrate,
    calibration_errors,
    fitter_from_config,
    scaled_probs,
)
from training.allowed_targets import check_targets

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "calibration"


def _draw(temperatures, n=20000, seed=0, spread=3.0):
    """Logits ``z`` and labels drawn from ``sigmoid(z / T0)``: the NLL-optimal temperature is ``T0`` per class."""
    rng = np.random.default_rng(seed)
    t0 = np.asarray(temperatures, dtype=float)
    z = rng.normal(0.0, spread, size=(n, len(t0))) - 1.0
    y = (rng.random(z.shape) < scaled_probs(z, t0)).astype(float)
    return z, y


def test_global_fit_recovers_the_temperature_labels_were_drawn_with():
    z, y = _draw([2.0, 2.0, 2.0])
    t = TemperatureFitter(mode="global").fit(z, y)
    assert t.shape == (3,) and np.all(t == t[0])
    assert t[0] == pytest.approx(2.0, rel=0.05)


def test_per_class_fit_recovers_each_class_temperature():
    t0 = [0.5, 1.0, 3.0]
    z, y = _draw(t0)
    t = TemperatureFitter(mode="per_class").fit(z, y)
    np.testing.assert_allclose(t, t0, rtol=0.08)


def test_unlabelled_entries_are_left_out_of_the_fit():
    z, y = _draw([2.0, 2.0])
    masked = y.copy()
    masked[::3] = -1  # every third image unlabelled; its (wrong-looking) targets must not pull the fit
    z_garbage = z.copy()
    z_garbage[::3] = 50.0
    fitter = TemperatureFitter(mode="global")
    keep = np.ones(len(y), bool)
    keep[::3] = False
    np.testing.assert_allclose(fitter.fit(z_garbage, masked), fitter.fit(z[keep], y[keep]), rtol=1e-6)


def test_a_class_without_validation_positives_keeps_the_global_temperature():
    z, y = _draw([2.0, 2.0, 2.0])
    y[:, 2] = 0.0
    per_class = TemperatureFitter(mode="per_class").fit(z, y)
    global_t = TemperatureFitter(mode="global").fit(z, y)
    assert per_class[2] == global_t[2]
    assert per_class[0] != global_t[0]


def test_the_fit_is_deterministic_and_clamped():
    z, y = _draw([1.5, 0.7], n=3000)
    fitter = TemperatureFitter(mode="per_class")
    np.testing.assert_array_equal(fitter.fit(z, y), fitter.fit(z, y))
    wrong = -10.0 * (2 * y - 1)  # confidently wrong: the likelihood keeps improving as T grows
    assert np.all(TemperatureFitter(mode="per_class", max_temperature=20.0).fit(wrong, y) == 20.0)


def test_scaling_lowers_the_ece_of_an_over_confident_model_and_keeps_ap_and_auroc():
    labels = ["a", "b", "c", "d"]
    true_z, y = _draw([1.0] * 4, n=5000, seed=1)
    over_confident = 3.0 * true_z + np.array([0.0, 1.0, -1.0, 0.5])
    for mode in ("global", "per_class"):
        t = TemperatureFitter(mode=mode).fit(over_confident, y)
        np.testing.assert_allclose(t, 3.0, rtol=0.15)
        before, after = scaled_probs(over_confident, np.ones(4)), scaled_probs(over_confident, t)
        suite_before = compute_suite(y, before, labels=labels, n_boot=0).metrics
        suite_after = compute_suite(y, after, labels=labels, n_boot=0).metrics
        errors_before, errors_after = calibration_errors(y, before), calibration_errors(y, after)
        assert errors_after["mECE"] < 0.5 * errors_before["mECE"]
        assert errors_after["ECE_pooled"] < errors_before["ECE_pooled"]
        for name in labels:  # a positive scale per class is monotone: rankings, so AP and AUROC, are unchanged
            assert suite_after[f"ap/{name}"] == pytest.approx(suite_before[f"ap/{name}"], abs=1e-12)
            assert suite_after[f"auroc/{name}"] == pytest.approx(suite_before[f"auroc/{name}"], abs=1e-12)
        for key in ("mECE", "ECE_pooled"):  # the same numbers as the suite's, so before/after compare with test/mECE
            assert errors_after[key] == pytest.approx(suite_after[key], abs=1e-12)
            assert errors_before[key] == pytest.approx(suite_before[key], abs=1e-12)


def test_test_side_before_and_after_are_recovered_from_the_scored_probabilities():
    z, y = _draw([2.0, 0.8], n=4000, seed=3)
    t = np.array([2.0, 0.8])
    applied = TemperatureResult("per_class", True, t, ["a", "b"])
    applied.add_test(y, scaled_probs(z, t).astype(np.float32))
    off = TemperatureResult("global", False, t, ["a", "b"])
    off.add_test(y, scaled_probs(z, np.ones(2)).astype(np.float32))
    expected_before = calibration_errors(y, scaled_probs(z, np.ones(2)))["mECE"]
    expected_after = calibration_errors(y, scaled_probs(z, t))["mECE"]
    for result in (applied, off):
        assert result.metrics["test/calibration/mECE_before"] == pytest.approx(expected_before, abs=1e-4)
        assert result.metrics["test/calibration/mECE_after"] == pytest.approx(expected_after, abs=1e-4)


class _Linear(torch.nn.Module):
    """A stand-in classifier: fixed logits per image, divided by the buffer unless told to ignore it."""

    def __init__(self, honour: bool = True):
        super().__init__()
        self.labels = ["a", "b"]
        self.weight = torch.nn.Parameter(torch.tensor([[3.0, -2.0]]))
        self.register_buffer("logit_temperature", torch.ones(2))
        self.honour = honour

    def forward(self, images):
        logits = images.flatten(1).mean(1, keepdim=True) * self.weight  # (B, 2)
        return logits / self.logit_temperature if self.honour else logits


def _datamodule(n=400, seed=0):
    rng = np.random.default_rng(seed)
    x = torch.tensor(rng.normal(size=(n, 1, 2, 2)), dtype=torch.float32)
    z = x.flatten(1).mean(1, keepdim=True).numpy() * np.array([[1.0, -1.0]])  # the truth is 3x (and 2x) softer
    y = torch.tensor((rng.random(z.shape) < scaled_probs(z, np.ones(2))).astype(np.float32))
    batches = [{"image": x[i : i + 64]} for i in range(0, n, 64)]
    return SimpleNamespace(eval_dataloader=lambda split: batches, datasets={"val": SimpleNamespace(targets=y)})


def test_calibrate_writes_the_fitted_temperature_into_the_model_only_when_configured():
    node = OmegaConf.load(CONFIGS / "per_class.yaml")
    model, datamodule = _Linear(), _datamodule()
    model.logit_temperature.fill_(7.0)  # a reloaded checkpoint's temperature: the fit starts from unscaled logits
    result = calibrate(model, datamodule, node)
    assert result.applied and result.mode == "per_class"
    np.testing.assert_allclose(model.logit_temperature.numpy(), result.temperature, rtol=1e-6)
    np.testing.assert_allclose(result.temperature, [3.0, 2.0], rtol=0.35)
    assert result.metrics["val/calibration/mECE_after"] < result.metrics["val/calibration/mECE_before"]
    assert result.logged()["calibration/applied"] == 1.0

    model = _Linear()
    diagnostic = calibrate(model, datamodule, OmegaConf.load(CONFIGS / "none.yaml"))
    assert not diagnostic.applied and diagnostic.mode == "global"
    assert torch.equal(model.logit_temperature, torch.ones(2))
    assert "calibration/temperature" in diagnostic.logged()

    assert calibrate(_Linear(honour=False), datamodule, node) is None  # a forward that ignores the buffer
    assert calibrate(torch.nn.Linear(2, 2), datamodule, node) is None  # no buffer at all


def test_the_configs_build_their_fitters_and_pass_the_stored_config_check():
    assert fitter_from_config(OmegaConf.load(CONFIGS / "none.yaml")) is None
    assert fitter_from_config(None) is None
    for mode in ("global", "per_class"):
        node = OmegaConf.load(CONFIGS / f"{mode}.yaml")
        check_targets(OmegaConf.to_container(node), f"{mode}.yaml")
        assert fitter_from_config(node).mode == mode == node.name
    with pytest.raises(ValueError, match="mode"):
        TemperatureFitter(mode="vector")


def test_the_report_says_before_after_and_whether_scaling_was_applied():
    z, y = _draw([2.0, 2.0], n=2000)
    for applied, word in ((True, "applied"), (False, "off")):
        result = TemperatureResult("global", applied, np.array([2.0, 2.0]), ["a", "b"])
        result.record("val", y, scaled_probs(z, np.ones(2)), scaled_probs(z, result.temperature))
        result.add_test(y, scaled_probs(z, result.temperature if applied else np.ones(2)))
        text = "\n".join(_calibration_section(SimpleNamespace(metrics=result.logged(), calibration=result)))
        assert f"Temperature scaling {word}" in text and "T = 2.000" in text
        assert "| val |" in text and "| test |" in text and " - |" not in text
    assert _calibration_section(SimpleNamespace(metrics={})) == []


def test_the_terminal_summary_has_the_test_ece_before_and_after():
    metrics = {"test/calibration/mECE_before": 0.2, "test/calibration/mECE_after": 0.05, "calibration/applied": 1.0}
    assert any(
        "mECE before/after temperature scaling (applied): 0.200 -> 0.050" in line for line in summary_lines(metrics)
    )
