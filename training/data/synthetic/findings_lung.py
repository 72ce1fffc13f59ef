"""Parenchymal findings: opacities, lucencies and lines inside the lungs, and the lung-volume findings.

Each rule follows the finding's radiological appearance; sizes and contrasts scale with the instance's
conspicuity ``c`` (see :mod:`rules`), positions are random within plausible zones.
"""

from __future__ import annotations

import cv2
import numpy as np

from training.data.synthetic.rules import alters, draws, lerp, side
from training.data.synthetic.scene import SHIFT, SIDES, SIGN, grid


def _blob(scene, x: float, y: float, sx: float, sy: float, angle: float = 0.0) -> np.ndarray:
    """Gaussian blob ``(n, n)`` with normalised sigmas, rotated by ``angle`` radians."""
    X, Y = grid(scene.n)
    dx, dy = X - x, Y - y
    c, s = np.cos(angle), np.sin(angle)
    u, v = (c * dx + s * dy) / sx, (-s * dx + c * dy) / sy
    return np.exp(-0.5 * (u * u + v * v))


@draws("Nodule")
def nodule(scene, rng, c):
    """Small (< 3 cm) round, well-defined opacity; subtle ones are a few millimetres and faint."""
    for _ in range(1 if rng.random() < 0.8 else 2):
        x, y = scene.lung_point(rng, zone=(0.08, 0.95))
        r = lerp(0.008, 0.022, c) * rng.uniform(0.85, 1.2)  # ~0.3-1 cm radius on a ~30 cm wide chest
        spot = scene.ellipse((x, y), (r, r * rng.uniform(0.85, 1.15)), rng.uniform(0, 180))
        scene.opacify(scene.blur(spot, 0.2 * r), lerp(0.35, 0.95, c))


@draws("Mass")
def mass(scene, rng, c):
    """Large (> 3 cm) lobulated opacity, sometimes spiculated, in the lung or at the hilum."""
    x, y = scene.lung_point(rng, zone=(0.1, 0.85))
    r = lerp(0.045, 0.09, c) * rng.uniform(0.9, 1.1)
    lobes = np.zeros((scene.n, scene.n), np.float32)
    for _ in range(4):
        ox, oy = rng.normal(0, 0.35 * r, 2)
        lobes = np.maximum(lobes, scene.ellipse((x + ox, y + oy), (0.7 * r, 0.7 * r * rng.uniform(0.8, 1.2))))
    if rng.random() < 0.4:  # spiculated margin
        angles = rng.uniform(0, 2 * np.pi, 10)
        spikes = [np.array([(x, y), (x + np.cos(a) * 1.25 * r, y + np.sin(a) * 1.25 * r)]) for a in angles]
        lobes = np.maximum(lobes, 0.6 * scene.lines(spikes, 0.003))
    scene.opacify(scene.blur(lobes, 0.08 * r) * scene.lung, lerp(0.55, 1.0, c))


@draws("Alveolar Pattern")
def alveolar(scene, rng, c):
    """Fluffy, confluent airspace opacity with ill-defined margins and air bronchograms."""
    g = scene.geom
    sides = list(SIDES) if rng.random() < 0.3 else [side(rng, 0.55)]
    for sd in sides:
        x, y = scene.lung_point(rng, sd, zone=pick_zone(rng))
        sx, sy = lerp(0.04, 0.1, c) * rng.uniform(0.8, 1.2), lerp(0.04, 0.09, c) * rng.uniform(0.8, 1.2)
        field = _blob(scene, x, y, sx, sy, rng.uniform(0, np.pi)) * (0.75 + 0.35 * scene.smooth_noise(rng, 14))
        region = np.clip((field - 0.3) / 0.35, 0.0, 1.0) * scene.pleura[sd]
        hx, hy = g.hilum[sd]
        away = np.arctan2(y - hy, x - hx)
        tubes = []
        for _ in range(int(rng.integers(2, 4))):  # air bronchograms: dark branching tubes inside the opacity
            a = away + rng.normal(0, 0.3)
            start = np.array([x - np.cos(a) * 0.5 * sx, y - np.sin(a) * 0.5 * sy])
            mid = start + 0.6 * sx * np.array([np.cos(a + rng.normal(0, 0.2)), np.sin(a + rng.normal(0, 0.2))])
            end = mid + 0.5 * sx * np.array([np.cos(a + rng.normal(0, 0.4)), np.sin(a + rng.normal(0, 0.4))])
            tubes.append(np.array([start, mid, end]))
            tubes.append(np.array([mid, mid + 0.4 * sx * np.array([np.cos(a + 0.6), np.sin(a + 0.6)])]))
        bronchi = scene.blur(scene.lines(tubes, 0.004), 0.002) * np.clip(2.0 * region - 0.6, 0.0, 1.0)
        scene.opacify(region * (1.0 - 0.6 * bronchi), lerp(0.45, 0.95, c))


def pick_zone(rng) -> tuple[float, float]:
    """A vertical lung zone, bases more often (gravity-dependent disease)."""
    zones = ((0.05, 0.4), (0.3, 0.7), (0.55, 0.95))
    return zones[int(rng.choice(3, p=(0.2, 0.3, 0.5)))]


@draws("Interstitial Pattern")
def interstitial(scene, rng, c):
    """Reticular (net-like) fine lines, bibasal or diffuse, with a faint haze."""
    g = scene.geom
    X, Y = grid(scene.n)
    basal = rng.random() < 0.65
    count = int(lerp(90, 260, c))
    xs = g.cx + rng.uniform(-1.0, 1.0, count) * g.hw
    top = g.apex + (0.45 if basal else 0.05) * (g.cp("R") - g.apex)
    ys = rng.uniform(top, max(g.cp("R"), g.cp("L")), count)
    angle = rng.uniform(0, np.pi, count)
    length = rng.uniform(0.012, 0.035, count)
    segs = np.stack([np.stack([xs, ys], 1), np.stack([xs + np.cos(angle) * length, ys + np.sin(angle) * length], 1)], 1)
    net = scene.lines(list(segs), 0.002)
    weight = np.clip((Y - top) / 0.15, 0, 1) * scene.lung
    scene.opacify(net * weight, lerp(0.25, 0.6, c))
    scene.opacify(weight, lerp(0.03, 0.12, c))


@alters("Atelectasis")
def atelectasis_volume(g, rng, c):
    """Volume loss: the ipsilateral hemidiaphragm rises and the hilum is pulled down."""
    sd = side(rng, 0.5)
    g.notes["Atelectasis"] = {"side": sd, "lobar": rng.random() < 0.3}
    g.dome[sd] -= lerp(0.005, 0.03, c)
    g.hilum[sd][1] += lerp(0.0, 0.015, c)


@draws("Atelectasis")
def atelectasis(scene, rng, c):
    """Plate-like (discoid) linear opacity at a base, or a collapsed lower lobe (triangle by the heart)."""
    g = scene.geom
    note = g.notes["Atelectasis"]
    sd, s = note["side"], SIGN[note["side"]]
    if note["lobar"]:
        hx, hy = g.hilum[sd]
        tri = np.array([(hx, hy), (g.cx + s * 0.03, g.cp(sd) - 0.02), (g.cx + s * 0.42 * g.hw, g.dome[sd] + 0.01)])
        scene.opacify(scene.blur(scene.polygon(tri), 0.006) * scene.pleura[sd], lerp(0.3, 0.8, c))
        return
    x, y = scene.lung_point(rng, sd, zone=(0.55, 0.85))
    half = lerp(0.03, 0.08, c) / 2
    tilt = rng.uniform(-0.2, 0.2)
    plate = np.array([(x - half, y - tilt * half), (x + half, y + tilt * half)])
    band = scene.blur(scene.lines([plate], lerp(0.005, 0.014, c)), 0.002)
    scene.opacify(band * scene.pleura[sd], lerp(0.45, 0.95, c))


@draws("Bronchiectasis")
def bronchiectasis(scene, rng, c):
    """Thick-walled dilated bronchi: parallel 'tram-track' lines and ring shadows, mostly at the bases."""
    g = scene.geom
    tracks, rings = [], scene.blank()
    for _ in range(int(lerp(4, 12, c))):
        sd = side(rng)
        x, y = scene.lung_point(rng, sd, zone=(0.45, 0.95))
        hx, hy = g.hilum[sd]
        a = np.arctan2(y - hy, x - hx)
        if rng.random() < 0.5:
            gap, length = rng.uniform(0.006, 0.01), rng.uniform(0.03, 0.06)
            d, p = np.array([np.cos(a), np.sin(a)]), np.array([-np.sin(a), np.cos(a)])
            for off in (-gap / 2, gap / 2):
                tracks.append(np.array([(x, y) + off * p, (x, y) + off * p + length * d]))
        else:
            r = rng.uniform(0.006, 0.012)
            cv2.circle(rings, tuple(int(v) for v in scene.fixed((x, y))), int(r * scene.n * (1 << SHIFT)), 255,
                       max(1, scene.px(0.0025)), cv2.LINE_AA, SHIFT)  # fmt: skip
    walls = np.maximum(scene.lines(tracks, 0.0025), scene.as_float(rings)) if tracks else scene.as_float(rings)
    scene.opacify(walls * scene.lung, lerp(0.35, 0.8, c))


@draws("Calcified Densities")
def calcified(scene, rng, c):
    """Calcified granulomas: tiny, very dense (bone-bright) dots in a lung or a hilum."""
    g = scene.geom
    for _ in range(int(rng.integers(1, 5))):
        if rng.random() < 0.3:
            sd = side(rng)
            x, y = g.hilum[sd][0] + rng.normal(0, 0.01), g.hilum[sd][1] + rng.normal(0, 0.015)
        else:
            x, y = scene.lung_point(rng)
        r = lerp(0.004, 0.008, c) * rng.uniform(0.8, 1.2)
        scene.add(scene.blur(scene.ellipse((x, y), (r, r)), 0.001), lerp(0.25, 0.6, c))


@alters("Emphysema")
def emphysema_shape(g, rng, c):
    """Hyperexpanded lungs: low flat domes, narrow vertical heart, more air, pruned vessels."""
    for sd in SIDES:
        g.dome[sd] = min(g.dome[sd] + lerp(0.02, 0.06, c), 0.86)
        g.depth[sd] *= lerp(0.8, 0.45, c)
    g.apex -= 0.01 * c
    g.ctr *= lerp(0.97, 0.88, c)
    g.lung_air *= lerp(1.06, 1.28, c)
    g.vessel_gain *= lerp(0.85, 0.55, c)


@draws("Emphysema")
def emphysema(scene, rng, c):
    """Extra lucency and loss of markings, worst in the upper zones (centrilobular pattern)."""
    g = scene.geom
    _, Y = grid(scene.n)
    upper = np.clip((g.dome["R"] - Y) / (g.dome["R"] - g.apex), 0, 1) * scene.lung
    scene.clear_markings(upper, lerp(0.3, 0.75, c))
    scene.add(upper, -lerp(0.02, 0.07, c))


@alters("Hyperinflated Lung")
def hyperinflated(g, rng, c):
    """Large lung volumes: domes low and flattened, heart long and narrow."""
    for sd in SIDES:
        g.dome[sd] = min(g.dome[sd] + lerp(0.02, 0.06, c), 0.87)
        g.depth[sd] *= lerp(0.85, 0.5, c)
    g.ctr *= lerp(0.98, 0.9, c)
    g.lung_air *= lerp(1.0, 1.08, c)


@alters("Hypoexpansion")
def hypoexpansion(g, rng, c):
    """Low lung volumes: both domes high, vessels crowded at the bases, heart looks broad."""
    for sd in SIDES:
        g.dome[sd] -= lerp(0.035, 0.085, c)
    g.vessel_crowd *= lerp(1.2, 1.7, c)
    g.ctr *= lerp(1.0, 1.06, c)


@draws("Hypoexpansion")
def hypoexpansion_haze(scene, rng, c):
    """Crowded basal markings read as a faint basal haze."""
    g = scene.geom
    _, Y = grid(scene.n)
    base = np.clip((Y - 0.5 * (g.apex + g.dome["R"])) / 0.15, 0, 1) * scene.lung
    scene.opacify(base, lerp(0.03, 0.12, c))


@alters("Hemidiaphragm Elevation")
def hemidiaphragm(g, rng, c):
    """One dome (usually the right) clearly higher than expected."""
    sd = side(rng, 0.6)
    g.dome[sd] -= lerp(0.035, 0.1, c)


@draws("Bulla")
def bulla(scene, rng, c):
    """Thin-walled, avascular, lucent air space, usually apical and peripheral."""
    for _ in range(1 if rng.random() < 0.7 else 2):
        x, y = scene.lung_point(rng, zone=(0.0, 0.55), peripheral=(0.4, 1.0))
        r = lerp(0.03, 0.07, c) * rng.uniform(0.85, 1.15)
        space = scene.ellipse((x, y), (r, r * rng.uniform(0.8, 1.1)), rng.uniform(0, 180)) * scene.lung
        scene.clear_markings(space, 1.0)
        scene.add(space, -lerp(0.03, 0.08, c))
        start = rng.uniform(0, 360)
        wall = scene.ellipse((x, y), (r, r), 0, start, start + rng.uniform(220, 360), width=0.002)
        scene.opacify(wall * scene.lung, lerp(0.25, 0.6, c))


@draws("Infarction")
def infarction(scene, rng, c):
    """Hampton hump: peripheral, pleural-based, wedge/dome-shaped opacity with its apex toward the hilum."""
    g = scene.geom
    sd = side(rng)
    pts = scene.contour[sd][scene.parts[sd]["lateral"]]
    y = g.apex + rng.uniform(0.55, 0.9) * (g.cp(sd) - g.apex)
    x = float(np.interp(y, pts[:, 1], pts[:, 0]))
    depth, half = lerp(0.025, 0.05, c), lerp(0.025, 0.045, c)
    hump = scene.ellipse((x, y), (depth, half), 0) * scene.pleura[sd]
    scene.opacify(scene.blur(hump, 0.004), lerp(0.4, 0.9, c))


@draws("Azygos Lobe")
def azygos(scene, rng, c):
    """Azygos fissure: a thin curved line from the right apex to a teardrop (the azygos vein) above the hilum."""
    g = scene.geom
    top = (g.cx - 0.3 * g.hw * rng.uniform(0.9, 1.2), g.apex + 0.01)
    end = (g.cx - g.med_hw - 0.01, g.carina - rng.uniform(0.03, 0.06))
    ctrl = (top[0] - rng.uniform(0.0, 0.03), 0.5 * (top[1] + end[1]))
    t = np.linspace(0, 1, 16)[:, None]
    curve = (1 - t) ** 2 * np.array(top) + 2 * (1 - t) * t * np.array(ctrl) + t**2 * np.array(end)
    scene.opacify(scene.lines([curve], 0.0025) * scene.lung, lerp(0.35, 0.85, c))
    drop = scene.ellipse(end, (0.011, 0.017), 10)
    scene.opacify(scene.blur(drop, 0.003), lerp(0.5, 1.0, c))
