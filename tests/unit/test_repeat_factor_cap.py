"""sampler.max_repeat (training/samplers/repeat_factor.py): the cap on an image's repeat factor, by hand."""

import numpy as np
import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from tests.conftest import PROJECT_ROOT
from training.samplers.repeat_factor import RepeatFactorSampling, repeat_factors

# 100 images: class 0 on image 0 only (f = 0.01), class 1 on images 0-49 (f = 0.5). With t = 1 the class factors
# are sqrt(1 / 0.01) = 10 and sqrt(1 / 0.5) = 1.414; image 0 takes the larger, the images 50-99 stay at 1.
TARGETS = np.zeros((100, 2), dtype=np.float32)
TARGETS[0, 0] = 1
TARGETS[:50, 1] = 1


def test_the_cap_bounds_only_the_images_above_it():
    free = repeat_factors(TARGETS, threshold=1.0)
    capped = repeat_factors(TARGETS, threshold=1.0, max_repeat=5)
    assert free[0] == pytest.approx(10.0) and capped[0] == pytest.approx(5.0)
    np.testing.assert_allclose(capped[1:50], np.sqrt(2.0))
    np.testing.assert_allclose(capped[50:], 1.0)


def test_the_epoch_length_follows_the_capped_factors():
    """round(5 + 49 sqrt(2) + 50) = round(124.30) = 124 draws; uncapped round(129.30) = 129."""
    assert len(RepeatFactorSampling(threshold=1.0, max_repeat=5).build(TARGETS, seed=0)) == 124
    assert len(RepeatFactorSampling(threshold=1.0).build(TARGETS, seed=0)) == 129


def test_image_zero_is_drawn_at_most_max_repeat_times():
    sampler = RepeatFactorSampling(threshold=1.0, max_repeat=5).build(TARGETS, seed=0)
    counts = [int(np.sum(np.fromiter(iter(sampler), int) == 0)) for _ in range(20)]
    assert max(counts) <= 6 and np.mean(counts) == pytest.approx(5.0, abs=0.6)  # 5 in expectation, a refill aside


def test_the_yaml_leaves_the_cap_off_and_a_cap_below_one_is_refused():
    node = OmegaConf.to_container(OmegaConf.load(PROJECT_ROOT / "configs" / "sampler" / "repeat_factor.yaml"))
    node.pop("name")
    assert instantiate(node).max_repeat is None
    with pytest.raises(ValueError, match="max_repeat"):
        RepeatFactorSampling(max_repeat=0.5)
