"""Logit post-processing against hand computation."""

import numpy as np
import pytest

from evaluation.postprocess import NormalGating, PriorLogitAdjustment


def test_normal_gating_scales_abnormal_classes_only():
    probs = np.array([[0.8, 0.5, 0.9], [0.1, 0.6, 0.3]])
    gated = NormalGating(alpha=2.0)(probs, ["Normal", "A", "B"], np.zeros(3))
    np.testing.assert_allclose(gated[:, 0], probs[:, 0])
    np.testing.assert_allclose(gated[0, 1:], probs[0, 1:] * 0.2**2)
    np.testing.assert_allclose(gated[1, 1:], probs[1, 1:] * 0.9**2)
    np.testing.assert_allclose(NormalGating(alpha=0.0)(probs, ["Normal", "A", "B"], np.zeros(3)), probs)


def test_normal_gating_needs_a_normal_output():
    with pytest.raises(ValueError, match="needs a 'Normal' output"):
        NormalGating()(np.zeros((1, 2)), ["A", "B"], np.zeros(2))


def test_logit_adjustment_removes_the_prior_and_keeps_per_class_ranking():
    probs = np.array([[0.2, 0.01], [0.5, 0.02], [0.9, 0.005]])
    prior = np.array([0.5, 0.01])
    adjusted = PriorLogitAdjustment(tau=1.0)(probs, ["A", "B"], prior)
    np.testing.assert_allclose(adjusted[:, 0], probs[:, 0], atol=1e-9)  # prior 0.5 has log-odds 0
    expected = 1 / (1 + np.exp(-(np.log(0.02 / 0.98) - np.log(0.01 / 0.99))))
    assert adjusted[1, 1] == pytest.approx(expected)
    assert (np.argsort(adjusted, axis=0) == np.argsort(probs, axis=0)).all()
    assert adjusted[1, 1] > probs[1, 1]  # the rare class is lifted
