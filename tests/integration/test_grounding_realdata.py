"""The grounding metrics' conventions on the real NIH boxes (../shared/data/nih-bbox): a signed CNR (an inverted map
scores minus the correct one) and TorchRay's pointing-game tolerance (a margin only adds hits)."""

from __future__ import annotations

import numpy as np
import pytest

from apps.benchmarks.framework.catalog import load_protocol
from apps.benchmarks.framework.grounding import grounding_scores
from apps.benchmarks.framework.heatmaps import centre_prior
from apps.benchmarks.framework.runner import draw_subsets
from tests.conftest import shared_data

pytestmark = pytest.mark.realdata


def test_signed_cnr_and_the_pointing_tolerance_on_the_real_boxes():
    protocol = load_protocol("nih-grounding")
    draw = draw_subsets(protocol, shared_data("nih-bbox"), "n200")
    findings, boxes, size = protocol.findings, draw.test.targets.boxes, 224
    prior = np.broadcast_to(centre_prior(size).astype(np.float64), (len(boxes), len(findings), size, size))
    scores = grounding_scores(prior, boxes, findings)
    inverted = grounding_scores(1 - prior, boxes, findings)
    scored = np.isfinite(scores[..., 1])
    assert scored.sum() >= 200  # every drawn image has at least one box
    np.testing.assert_allclose(inverted[..., 1][scored], -scores[..., 1][scored], rtol=1e-9, atol=1e-12)
    heart = findings.index("Cardiomegaly")
    assert np.nanmean(scores[:, heart, 1]) > 0 > np.nanmean(inverted[:, heart, 1])  # hearts are central
    strict = grounding_scores(prior, boxes, findings, tolerance=0)
    assert (scores[..., 0][scored] >= strict[..., 0][scored]).all()  # a margin can only add hits
    np.testing.assert_array_equal(strict[..., 1][scored], scores[..., 1][scored])  # CNR has no tolerance
