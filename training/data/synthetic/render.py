"""Draw one synthetic radiograph from its specification: anatomy, findings, acquisition.

Every random choice comes from streams seeded by ``(seed, image index)`` (and the finding's index for finding
rules), never from a shared generator, so an image is the same whichever worker draws it and in whatever order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from training.data.synthetic.anatomy import image_geometry, render_anatomy, sample_patient
from training.data.synthetic.centres import develop, native_size
from training.data.synthetic.findings import RULES
from training.data.synthetic.labels import FINDINGS, INDEX
from training.data.synthetic.rules import conspicuity


@dataclass(frozen=True)
class ImageSpec:
    """Everything that determines one image (small and picklable, sent to the drawing workers)."""

    seed: int
    index: int  # global image index; with ``seed`` it fixes every random choice of the image
    patient: int
    age: float
    female: bool
    source: str
    view: str
    findings: tuple[str, ...]  # clean positive findings


def _stream(spec: ImageSpec, *key: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([spec.seed, 31, spec.index, *key]))


def render_image(spec: ImageSpec, image_size: int, noiseless: bool = False, return_scene: bool = False):
    """Render ``spec`` as an ``(image_size, image_size)`` uint8 film.

    Args:
        spec: the image to draw.
        image_size: output size in pixels.
        noiseless: no quantum noise or marker (measurements in tests).
        return_scene: also return the :class:`scene.Scene` (geometry, masks) for inspection.
    """
    active = [name for name in FINDINGS if name in spec.findings]  # canonical order, whatever the input order
    unknown = set(spec.findings) - set(FINDINGS)
    if unknown:
        raise ValueError(f"unknown findings {sorted(unknown)}")
    geometry = image_geometry(
        sample_patient(spec.seed, spec.patient, spec.age, spec.female), _stream(spec, 1), spec.view
    )
    streams = {name: _stream(spec, 100 + INDEX[name]) for name in active}
    strength = {name: conspicuity(streams[name]) for name in active}
    for name in active:
        rule = RULES[name]
        if rule.alter is not None:
            rule.alter(geometry, streams[name], strength[name])
    scene = render_anatomy(geometry, native_size(spec.source, image_size), frozenset(active), _stream(spec, 2))
    for name in active:
        rule = RULES[name]
        if rule.draw is not None:
            rule.draw(scene, streams[name], strength[name])
    density = scene.density + scene.texture * scene.lung  # (n, n)
    image = develop(density, spec.source, _stream(spec, 3), image_size, noiseless)
    return (image, scene) if return_scene else image
