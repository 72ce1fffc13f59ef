"""Heart, aorta, hila and mediastinum: silhouette changes and their calcifications/masses."""

from __future__ import annotations

import numpy as np

from training.data.synthetic.rules import alters, draws, lerp, side
from training.data.synthetic.scene import SIDES, SIGN


@alters("Cardiomegaly")
def cardiomegaly(g, rng, c):
    """Enlarged cardiac silhouette: cardiothoracic ratio above 0.5 (0.52 borderline to 0.66 gross)."""
    g.ctr = max(g.ctr, lerp(0.505, 0.64, c) * rng.uniform(0.995, 1.03))
    g.heart_b *= lerp(1.02, 1.12, c)


@alters("Aortic Elongation")
def aortic_elongation(g, rng, c):
    """Unfolded, elongated aorta: a bigger, higher, more lateral knob and a bulging descending aorta."""
    g.knob[0] += lerp(0.002, 0.02, c)
    g.knob[1] -= lerp(0.0, 0.02, c)
    g.knob[2] *= lerp(1.04, 1.4, c)
    g.aorta_unfold = min(1.2, g.aorta_unfold + lerp(0.1, 0.7, c))


@draws("Aortic Atheromatosis")
def aortic_atheromatosis(scene, rng, c):
    """Calcified intimal plaque: a thin bright curvilinear rim along the aortic knob."""
    g = scene.geom
    dx, y, r = g.knob
    sweep = lerp(40, 140, c)
    start = rng.uniform(-130, -40)
    arc = scene.ellipse((g.cx + dx, y), (0.9 * r, 0.9 * r), 0, start, start + sweep, width=0.004)
    scene.add(arc, lerp(0.15, 0.45, c))


@alters("Vascular Hilar Enlargement")
def hilar_enlargement(g, rng, c):
    """Enlarged central pulmonary arteries: bigger hila and more prominent proximal vessels."""
    g.hilum_scale *= lerp(1.3, 1.9, c)
    g.vessel_gain *= lerp(1.05, 1.3, c)


@draws("Vascular Hilar Enlargement")
def hilar_shadows(scene, rng, c):
    g = scene.geom
    for sd in SIDES:
        hx, hy = g.hilum[sd]
        shadow = scene.ellipse(
            (hx + SIGN[sd] * 0.008, hy), (0.028 * g.hilum_scale, 0.045 * g.hilum_scale), SIGN[sd] * 15
        )
        scene.opacify(scene.blur(shadow, 0.01), lerp(0.25, 0.6, c))


@draws("Adenopathy")
def adenopathy(scene, rng, c):
    """Enlarged nodes: lobulated widening of the right paratracheal stripe, the hila or the aortopulmonary window."""
    g = scene.geom
    sites = {
        "paratracheal": (g.cx - g.med_hw - 0.004, g.carina - 0.05),
        "hilar_R": (g.hilum["R"][0] + 0.01, g.hilum["R"][1]),
        "hilar_L": (g.hilum["L"][0] - 0.01, g.hilum["L"][1]),
        "ap_window": (g.cx + g.med_hw + 0.006, g.knob[1] + 0.045),
    }
    names = list(sites)
    chosen = rng.choice(len(names), size=int(rng.integers(1, 4)), replace=False)
    nodes = np.zeros((scene.n, scene.n), np.float32)
    for k in chosen:
        x, y = sites[names[k]]
        for _ in range(int(rng.integers(2, 5))):  # a cluster of round nodes -> lobulated contour
            r = lerp(0.012, 0.026, c) * rng.uniform(0.8, 1.2)
            nodes = np.maximum(nodes, scene.ellipse((x + rng.normal(0, 0.01), y + rng.normal(0, 0.02)), (r, r)))
    scene.opacify(scene.blur(nodes, 0.003), lerp(0.6, 1.0, c))


@alters("Goiter")
def goiter_shape(g, rng, c):
    """The enlarged thyroid pushes the trachea to the other side."""
    mass_side = side(rng, 0.5)
    g.notes["Goiter"] = mass_side
    g.trachea_dev = -SIGN[mass_side] * lerp(0.008, 0.03, c)


@draws("Goiter")
def goiter(scene, rng, c):
    """Cervicothoracic soft-tissue mass widening the superior mediastinum at the thoracic inlet."""
    g = scene.geom
    s = SIGN[g.notes["Goiter"]]
    center = (g.cx + s * lerp(0.01, 0.03, c), g.apex + rng.uniform(-0.01, 0.03))
    axes = (lerp(0.08, 0.14, c), lerp(0.05, 0.09, c))
    mass = scene.blur(scene.ellipse(center, axes, s * rng.uniform(0, 15)), 0.006)
    scene.opacify(mass, lerp(0.6, 1.0, c))
    scene.add(mass * (1.0 - scene.lung), lerp(0.03, 0.08, c))
