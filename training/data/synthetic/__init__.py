"""Built-in SYNTHETIC frontal chest radiographs: a procedurally drawn, long-tailed, multi-label test bed.

Each of the 36 findings has a drawing rule that follows its radiological appearance (:mod:`.findings`); labels
follow a PadChest-like long tail with co-occurrence, follow-up images and train-only label noise (:mod:`.labels`);
two centres differ in acquisition (:mod:`.centres`). Everything is deterministic from a seed.

    from training.data.synthetic import generate
    manifest = generate("data/synthetic/default")  # 6000/1500/1500 images at 128 px, cached by parameters
"""

from training.data.synthetic.generate import GENERATOR_VERSION, generate
from training.data.synthetic.labels import (
    FINDINGS,
    TASK1_LABELS,
    TASK2_LABELS,
    LabelConfig,
    frequency_group,
    sample_labels,
)
from training.data.synthetic.render import ImageSpec, render_image

__all__ = [
    "FINDINGS",
    "GENERATOR_VERSION",
    "TASK1_LABELS",
    "TASK2_LABELS",
    "ImageSpec",
    "LabelConfig",
    "frequency_group",
    "generate",
    "render_image",
    "sample_labels",
]
