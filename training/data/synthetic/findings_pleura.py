"""Pleural, diaphragmatic and extra-thoracic air/fluid findings.

Effusion and pneumothorax work on the *pleural space* mask (the whole lung outline, heart included), so fluid
fills the costophrenic recess and a pneumothorax strips markings between the chest wall and the collapsed lung.
"""

from __future__ import annotations

import numpy as np

from training.data.synthetic.rules import draws, lerp, side
from training.data.synthetic.scene import SIDES, SIGN, grid


def _sides(rng, p_right: float, p_both: float) -> list[str]:
    return list(SIDES) if rng.random() < p_both else [side(rng, p_right)]


@draws("Pleural Effusion")
def effusion(scene, rng, c):
    """Homogeneous basal opacity with a meniscus (rising laterally) that blunts the costophrenic angle.

    Subtle effusions only fill the lateral recess; large ones climb the chest wall and hide the dome.
    """
    g = scene.geom
    X, Y = grid(scene.n)
    for sd in _sides(rng, 0.55, 0.25):
        s, hw = SIGN[sd], g.hw * g.width[sd]
        height = lerp(0.012, 0.19, c) * rng.uniform(0.8, 1.2)  # fluid height at the chest wall above the angle
        lateral = np.clip((s * (X - g.cx) - 0.03) / (hw - 0.03), 0.0, 1.0)
        level = g.cp(sd) - height * (0.25 + 0.75 * lateral**3)  # (n, n) concave meniscus, climbing the wall
        depth = np.clip((Y - level) / 0.05, 0.0, 1.0)
        fluid = np.clip((Y - level) / 0.006 + 0.5, 0.0, 1.0) * (0.75 + 0.25 * depth) * scene.pleura[sd]
        scene.opacify(scene.blur(fluid, 0.003), lerp(0.6, 1.0, c))


def pneumothorax_rim(scene, rng, sd: str, size: float, fluid_level: float | None = None) -> None:
    """Collapse lung ``sd`` by ``size`` toward its hilum: lucent markings-free rim plus a visceral pleural line.

    Args:
        size: fraction of the outline's distance to the hilum lost (0.1 = small apical/lateral rim).
        fluid_level: y of a horizontal air-fluid level (hydropneumothorax); below it the pleural space is fluid.
    """
    g = scene.geom
    _, Y = grid(scene.n)
    anchor = np.array([g.cx + SIGN[sd] * 0.06, g.hilum[sd][1] + 0.06])
    outline = scene.contour[sd]
    collapsed = anchor + (outline - anchor) * (1.0 - size)
    lung_left = scene.polygon(collapsed)
    rim = scene.pleura[sd] * (1.0 - lung_left)
    fluid = np.zeros_like(rim) if fluid_level is None else scene.pleura[sd] * np.clip((Y - fluid_level) / 0.003, 0, 1)
    scene.clear_markings(rim, 1.0)
    scene.add(rim * (1.0 - fluid), -0.08)  # no lung tissue in the rim: darker than the lung
    scene.opacify(lung_left * scene.pleura[sd], 0.08 + 0.4 * size)  # the collapsed lung holds less air
    line = collapsed[scene.parts[sd]["lateral"]]
    scene.opacify(scene.lines([line], 0.002) * scene.pleura[sd] * (1.0 - fluid), 0.7)
    if fluid_level is not None:
        scene.opacify(fluid, 1.0)  # fluid replaces the air below the level, in the rim and in the lung


@draws("Pneumothorax")
def pneumothorax(scene, rng, c):
    """Apical/lateral lucent rim without lung markings, bounded by a thin visible pleural line."""
    pneumothorax_rim(scene, rng, side(rng, 0.55), lerp(0.07, 0.3, c) * rng.uniform(0.85, 1.15))


@draws("Hydropneumothorax")
def hydropneumothorax(scene, rng, c):
    """Pneumothorax with a straight horizontal air-fluid level in the pleural space."""
    g = scene.geom
    sd = side(rng, 0.5)
    level = g.cp(sd) - lerp(0.05, 0.16, c) * rng.uniform(0.8, 1.2)
    pneumothorax_rim(scene, rng, sd, lerp(0.12, 0.32, c), fluid_level=level)


@draws("Pleural Thickening")
def pleural_thickening(scene, rng, c):
    """Smooth soft-tissue band along the lateral chest wall, or an apical cap."""
    for sd in _sides(rng, 0.5, 0.3):
        outline = scene.contour[sd]
        lateral = outline[scene.parts[sd]["lateral"]]
        if rng.random() < 0.3:  # apical cap: both sides of the apex
            band = np.vstack([outline[-5:], lateral[:6]])
        else:
            a = int(rng.integers(4, 12))
            band = lateral[a : a + int(rng.integers(6, 12))]
        width = lerp(0.008, 0.024, c) * 2.0  # centred on the wall, the pleural mask keeps the inner half
        strip = scene.blur(scene.lines([band], width), 0.003) * scene.pleura[sd]
        scene.opacify(strip, lerp(0.5, 0.95, c))


@draws("Pneumoperitoneum")
def pneumoperitoneum(scene, rng, c):
    """Free air: a lucent crescent under the (right) hemidiaphragm, outlining its thin muscular dome."""
    for sd in _sides(rng, 0.85, 0.3):
        dome = scene.contour[sd][scene.parts[sd]["dome"]]
        dome = dome[np.argsort(dome[:, 0])]
        t = (dome[:, 0] - dome[0, 0]) / (dome[-1, 0] - dome[0, 0])
        thick = lerp(0.007, 0.025, c) * np.sin(np.pi * t) ** 0.7
        top = dome + np.array([0.0, 0.005])
        crescent = np.vstack([top, (top + np.stack([np.zeros_like(thick), thick], 1))[::-1]])
        scene.add(scene.blur(scene.polygon(crescent), 0.002), -lerp(0.25, 0.5, c))


@draws("Subcutaneous Emphysema")
def subcutaneous_emphysema(scene, rng, c):
    """Streaky, branching lucencies along the fascial planes of the chest wall and neck soft tissues."""
    g = scene.geom
    streaks = []
    sides = _sides(rng, 0.5, 0.35)
    for _ in range(int(lerp(14, 45, c))):
        sd = sides[int(rng.integers(len(sides)))]
        s = SIGN[sd]
        y = rng.uniform(g.clav_y - 0.05, g.dome[sd])
        x = g.cx + s * (g.hw * g.width[sd] + rng.uniform(0.0, g.body_hw - g.hw + 0.02))
        a = np.deg2rad(90 + rng.normal(0, 35))
        length = rng.uniform(0.015, 0.05)
        streaks.append(np.array([(x, y), (x + np.cos(a) * length, y + np.sin(a) * length)]))
    air = scene.lines(streaks, 0.003) * (1.0 - scene.lung)
    scene.add(scene.blur(air, 0.0015), -lerp(0.15, 0.4, c))


@draws("Hernia")
def hiatal_hernia(scene, rng, c):
    """Hiatal hernia: a round retrocardiac gas bubble above the left dome, often with an air-fluid level."""
    g = scene.geom
    r = lerp(0.025, 0.055, c) * rng.uniform(0.85, 1.15)
    x = g.cx + rng.uniform(-0.01, 0.04)
    y = min(g.dome["L"], g.dome["R"]) - lerp(0.01, 0.04, c) - r
    _, Y = grid(scene.n)
    sac = scene.ellipse((x, y), (r * 1.15, r))
    level = y + r * rng.uniform(-0.1, 0.45)
    gas = sac * np.clip((level - Y) / 0.003, 0.0, 1.0)
    scene.add(scene.blur(gas, 0.002), -lerp(0.12, 0.3, c))
    scene.add(scene.ellipse((x, y), (r * 1.15, r), width=0.003), lerp(0.02, 0.05, c))
