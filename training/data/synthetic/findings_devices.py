"""Lines, tubes, wires and hardware: thin bright (radiopaque) structures.

``Support Devices`` draws one to three devices from :data:`DEVICES` (a registry like the finding rules); a
central venous catheter is itself a support device, so next to one fewer extra devices are drawn.
"""

from __future__ import annotations

import numpy as np

from training.data.synthetic.rules import draws, lerp, side
from training.data.synthetic.scene import SIGN


def _bezier(points, k: int = 24) -> np.ndarray:
    """Quadratic/cubic Bezier through control ``points`` (3 or 4 of them), sampled at ``k`` positions."""
    p = np.asarray(points, dtype=float)
    t = np.linspace(0.0, 1.0, k)[:, None]
    if len(p) == 3:
        return (1 - t) ** 2 * p[0] + 2 * (1 - t) * t * p[1] + t**2 * p[2]
    return (1 - t) ** 3 * p[0] + 3 * (1 - t) ** 2 * t * p[1] + 3 * (1 - t) * t**2 * p[2] + t**3 * p[3]


def _tube(scene, path: np.ndarray, width: float, amount: float, walls: bool = False) -> None:
    """A radiopaque line along ``path``; ``walls`` draws a tube as two parallel lines (lumen visible)."""
    if not walls:
        scene.add(scene.lines([path], width), amount)
        return
    d = np.gradient(path, axis=0)
    normal = np.stack([-d[:, 1], d[:, 0]], 1) / (np.linalg.norm(d, axis=1, keepdims=True) + 1e-9)
    edges = [path + normal * width, path - normal * width]
    scene.add(scene.lines(edges, 0.0025), amount)


@draws("Central Venous Catheter")
def central_line(scene, rng, c):
    """Thin catheter from a subclavian or jugular vein, down the SVC, tip near the cavoatrial junction."""
    g = scene.geom
    sd = side(rng, 0.65)
    s = SIGN[sd]
    tip = (g.cx - g.med_hw * rng.uniform(0.4, 0.8), g.carina + rng.uniform(-0.02, 0.07))
    bend = (g.cx - g.med_hw * 0.7, g.clav_y + 0.05)
    if rng.random() < 0.6:  # subclavian: enters under the lateral clavicle
        entry = (g.cx + s * (g.hw + 0.04), g.clav_y + 0.01)
        path = _bezier([entry, (g.cx + s * 0.1, g.clav_y + 0.05), bend, tip])
    else:  # internal jugular: straight down the neck
        entry = (g.cx + s * 0.06, -0.02)
        path = _bezier([entry, (g.cx + s * 0.05, g.clav_y), bend, tip])
    _tube(scene, path, 0.004, lerp(0.12, 0.35, c))
    if rng.random() < 0.2:  # implanted port: a reservoir on the chest wall
        scene.add(scene.ellipse(entry, (0.016, 0.016), width=0.005), lerp(0.3, 0.6, c))


def _endotracheal(scene, rng, c):
    g = scene.geom
    tip = g.carina - rng.uniform(0.03, 0.08)
    path = np.array([(g.cx + g.trachea_dev * 0.3, -0.02), (g.cx, tip)])
    path = np.stack([np.interp(np.linspace(0, 1, 8), [0, 1], path[:, i]) for i in range(2)], 1)
    _tube(scene, path, 0.007, lerp(0.12, 0.3, c), walls=True)


def _nasogastric(scene, rng, c):
    g = scene.geom
    stomach = (g.cx + 0.45 * g.hw, g.dome["L"] + 0.07)
    path = _bezier([(g.cx + 0.01, -0.02), (g.cx + 0.02, 0.5), (g.cx + 0.03, g.dome["L"] + 0.04), stomach], 30)
    _tube(scene, path, 0.004, lerp(0.12, 0.3, c))


def _ecg_leads(scene, rng, c):
    g = scene.geom
    snaps = []
    for _ in range(int(rng.integers(2, 5))):
        s = float(rng.choice([-1, 1]))
        x = g.cx + s * g.hw * rng.uniform(0.3, 1.05)
        y = rng.uniform(g.clav_y, g.dome["R"])
        snaps.append((x, y))
        scene.add(scene.ellipse((x, y), (0.011, 0.011), width=0.004), lerp(0.2, 0.45, c))
        scene.add(scene.ellipse((x, y), (0.003, 0.003)), lerp(0.3, 0.6, c))
        wire = _bezier([(x, y), (x + s * rng.uniform(0.05, 0.2), y + rng.uniform(-0.2, 0.2)), (x + s * 0.6, y)], 20)
        _tube(scene, wire, 0.003, lerp(0.06, 0.15, c))


def _pacemaker(scene, rng, c):
    g = scene.geom
    s = SIGN["L"] if rng.random() < 0.8 else SIGN["R"]
    box = (g.cx + s * g.hw * rng.uniform(0.6, 0.8), g.clav_y + rng.uniform(0.03, 0.07))
    scene.add(scene.blur(scene.ellipse(box, (0.03, 0.022), rng.uniform(-20, 20)), 0.002), lerp(0.5, 1.0, c))
    hx, hy, a, b, _ = g.heart()
    for target in ((hx + 0.35 * a, hy + 0.55 * b), (g.cx - 0.03, hy - 0.25 * b)):  # RV apex, right atrium
        lead = _bezier([box, (g.cx + s * 0.08, g.clav_y + 0.04), (g.cx - g.med_hw * 0.6, g.carina), target], 30)
        _tube(scene, lead, 0.004, lerp(0.2, 0.45, c))


def _chest_tube(scene, rng, c):
    g = scene.geom
    s = SIGN[side(rng)]
    entry = (g.cx + s * (g.body_hw + 0.02), g.dome["R"] - rng.uniform(0.02, 0.1))
    inside = (g.cx + s * g.hw * 0.85, entry[1] - 0.03)
    tip = (g.cx + s * g.hw * rng.uniform(0.35, 0.6), g.apex + rng.uniform(0.03, 0.1))
    _tube(scene, _bezier([entry, inside, tip], 24), 0.008, lerp(0.15, 0.35, c), walls=True)


DEVICES = {"endotracheal": _endotracheal, "nasogastric": _nasogastric, "ecg": _ecg_leads,
           "pacemaker": _pacemaker, "chest_tube": _chest_tube}  # fmt: skip
DEVICE_WEIGHTS = np.array([0.2, 0.2, 0.3, 0.15, 0.15])


@draws("Support Devices")
def support_devices(scene, rng, c):
    """One to three tubes/lines/wires/generators; fewer when a central line already accounts for the label."""
    has_line = "Central Venous Catheter" in scene.labels
    count = int(rng.integers(0 if has_line else 1, 3 if has_line else 4))
    names = list(DEVICES)
    for k in rng.choice(len(names), size=count, replace=False, p=DEVICE_WEIGHTS):
        DEVICES[names[k]](scene, rng, c)


@draws("Sternotomy")
def sternotomy(scene, rng, c):
    """Median sternotomy: a vertical column of twisted wire loops over the midline."""
    g = scene.geom
    _, hy, _, b, _ = g.heart()
    count = int(rng.integers(4, 8))
    ys = np.linspace(g.clav_y + 0.06, hy - 0.2 * b, count) + rng.normal(0, 0.006, count)
    loops = np.zeros((scene.n, scene.n), np.float32)
    for y in ys:
        x = g.cx + rng.normal(0.0, 0.005)
        w = lerp(0.008, 0.014, c)
        loops = np.maximum(loops, scene.ellipse((x, y), (w, 0.0045), rng.uniform(-20, 20), width=0.0028))
        knot = np.array([(x + w, y), (x + w + 0.008, y + rng.uniform(-0.006, 0.006))])
        loops = np.maximum(loops, scene.lines([knot], 0.003))
    scene.add(loops, lerp(0.35, 0.9, c))
