"""Skeletal findings. Most change the geometry the skeleton is drawn from (see :mod:`skeleton`)."""

from __future__ import annotations

import cv2
import numpy as np

from training.data.synthetic.rules import alters, draws, lerp, side
from training.data.synthetic.scene import SHIFT


@alters("Fracture")
def fracture(g, rng, c):
    """Rib fracture: a cortical break with a step-off of the distal fragment, lateral/posterolateral arc."""
    sd = side(rng)
    first = int(rng.integers(3, 9))
    for k in range(1 if rng.random() < 0.7 else int(rng.integers(2, 4))):  # sometimes consecutive ribs
        g.fractures.append({
            "side": sd, "rib": first + k, "t": float(rng.uniform(0.45, 0.85)),
            "gap": lerp(0.003, 0.01, c), "step": float(rng.choice([-1, 1])) * lerp(0.004, 0.016, c),
        })  # fmt: skip
    g.notes["Fracture"] = {"callus": rng.random() < 0.35}


@draws("Fracture")
def fracture_callus(scene, rng, c):
    """Healing fractures get a faint fusiform callus around the break."""
    g = scene.geom
    if not g.notes["Fracture"]["callus"]:
        return
    for f in g.fractures:
        if "xy" in f:
            scene.add(scene.blur(scene.ellipse(f["xy"], (0.014, 0.008), rng.uniform(-20, 20)), 0.003), 0.06)


@alters("Kyphosis")
def kyphosis(g, rng, c):
    """Thoracic kyphosis on a frontal film: foreshortened mid-thoracic bodies, steep ribs, high clavicles."""
    g.kyphosis = lerp(0.35, 1.0, c)
    g.clav_y -= lerp(0.01, 0.035, c)
    g.clav_tilt *= lerp(0.8, 0.3, c)
    g.apex += lerp(0.005, 0.02, c)


@draws("Kyphosis")
def kyphosis_overlap(scene, rng, c):
    """The flexed neck and chin overlap the apices; the wedged bodies' endplates superimpose."""
    g = scene.geom
    scene.add(scene.blur(scene.ellipse((g.cx, g.apex - 0.03), (0.2, 0.07)), 0.02), lerp(0.02, 0.1, c))
    plates = [np.array([(x - hw, y - hh), (x + hw, y - hh)]) for x, y, hw, hh, _ in scene.vertebrae if 0.2 < y < 0.55]
    scene.add(scene.lines(plates, 0.003), lerp(0.05, 0.12, c))


@alters("Scoliosis")
def scoliosis(g, rng, c):
    """Lateral curvature of the spine (C or S shaped), with the ribs and chest wall following it."""
    amp = float(rng.choice([-1, 1])) * lerp(0.015, 0.05, c)
    g.scol_amp = amp
    g.scol_waves = 1.0 if rng.random() < 0.6 else 2.0
    convex = "L" if amp > 0 else "R"
    concave = "R" if convex == "L" else "L"
    g.width[convex] *= 1.0 + 1.2 * abs(amp)
    g.width[concave] *= 1.0 - 1.2 * abs(amp)


@alters("Osteopenia")
def osteopenia(g, rng, c):
    """Reduced bone density: fainter bones with thin cortices."""
    g.bone *= lerp(0.8, 0.5, c)
    g.cortex *= lerp(0.8, 0.45, c)


@draws("Vertebral Degenerative Changes")
def degenerative(scene, rng, c):
    """Spondylosis: marginal osteophytes (spurs at the vertebral corners) and endplate sclerosis."""
    bodies = [b for b in scene.vertebrae if 0.3 < b[1] < 0.95]
    count = min(len(bodies), int(lerp(2, 7, c)))
    first = int(rng.integers(0, max(1, len(bodies) - count + 1)))
    spurs, plates = scene.blank(), []
    for x, y, hw, hh, _ in bodies[first : first + count]:
        plates += [np.array([(x - hw, y + e * hh), (x + hw, y + e * hh)]) for e in (-1, 1)]
        for sx in (-1, 1):
            for sy in (-1, 1):
                if rng.random() < 0.3 + 0.5 * c:
                    o = lerp(0.004, 0.013, c) * rng.uniform(0.7, 1.2)
                    corner = np.array([x + sx * hw, y + sy * hh])
                    tri = np.array([corner - [0, sy * 0.35 * hh], corner + [sx * o, sy * 0.4 * o], corner])
                    cv2.fillPoly(spurs, [scene.fixed(tri)], 255, cv2.LINE_AA, SHIFT)
    scene.add(scene.as_float(spurs), lerp(0.12, 0.3, c))
    scene.add(scene.lines(plates, 0.004), lerp(0.05, 0.15, c))
