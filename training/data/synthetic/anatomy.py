"""The base thorax: patient geometry, its per-image jitter, and the soft-tissue render (body, lungs, heart,
mediastinum, aorta, trachea, hila, diaphragm, stomach bubble, lung markings). Bones live in :mod:`skeleton`.

Geometry is a plain dataclass of normalised numbers so that finding rules can *alter* it before anything is
drawn (cardiomegaly widens the heart, emphysema flattens the domes, scoliosis bends the spine); the render then
derives every mask from it, so the silhouettes stay coherent (an enlarged heart really pushes the lung border).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import cv2
import numpy as np

from training.data.synthetic import skeleton
from training.data.synthetic.scene import ONE, SHIFT, SIDES, SIGN, Scene, grid


@dataclass
class Geometry:
    """Normalised anatomy of one radiograph (x across, y down, both in [0, 1] of the canvas)."""

    cx: float  # midline (spine / trachea) x
    hw: float  # thoracic half-width at its widest level (inner rib margin)
    width: dict  # side -> multiplier of hw (asymmetric chest, scoliosis)
    apex: float  # y of the lung apices
    dome: dict  # side -> y of the diaphragm dome peak (right normally higher)
    depth: dict  # side -> depth of the costophrenic angle below the dome peak
    ctr: float  # cardiothoracic ratio: heart horizontal extent / (2 hw)
    heart_b: float  # vertical semi-axis of the heart ellipse
    heart_angle: float  # tilt of the heart ellipse, degrees
    med_hw: float  # half-width of the upper mediastinum
    knob: list  # aortic knob [dx from midline, y, radius]
    carina: float  # y of the carina
    hilum: dict  # side -> [x, y] hilar centre
    body_hw: float  # half-width of the soft-tissue outline
    neck_hw: float
    clav_y: float  # y of the clavicles' medial heads
    clav_tilt: float  # how much the lateral clavicle rises
    scapula: float  # 0 = rotated off the lungs (PA), 1 = over the lungs (AP)
    rib_drop: float  # how steeply the posterior ribs fall laterally
    lung_air: float  # density removed by aerated lung (more = darker lungs)
    breast: float  # breast shadow size (0 = none)
    gastric: float  # gastric bubble size (0 = none)
    trachea_w: float = 0.022
    trachea_dev: float = 0.0  # lateral deviation of the upper trachea (goiter)
    aorta_unfold: float = 0.0  # unfolding of the arch / descending aorta (grows with age; aortic elongation)
    hilum_scale: float = 1.0
    bone: float = 1.0  # bone mineral density multiplier (osteopenia < 1)
    cortex: float = 0.45  # cortical thickness as a fraction of the bone width
    scol_amp: float = 0.0  # lateral spinal curvature amplitude (scoliosis)
    scol_waves: float = 1.0  # 1 = C-shaped curve, 2 = S-shaped
    kyphosis: float = 0.0
    fractures: list = field(default_factory=list)  # dicts: side, rib, t, gap, step
    vessel_gain: float = 1.0  # prominence of lung markings (emphysema < 1)
    vessel_crowd: float = 1.0  # crowding at the bases (hypoexpansion > 1)
    notes: dict = field(default_factory=dict)  # per-finding choices shared between a rule's alter and draw

    def cp(self, side: str) -> float:
        """y of the costophrenic angle."""
        return self.dome[side] + self.depth[side]

    def heart(self) -> tuple[float, float, float, float, float]:
        """Heart ellipse ``(x, y, a, b, angle)`` whose horizontal extent is exactly ``ctr * 2 hw``."""
        extent = self.ctr * 2.0 * self.hw
        theta = np.deg2rad(self.heart_angle)
        half = extent / 2.0
        a = np.sqrt(max(half**2 - (self.heart_b * np.sin(theta)) ** 2, 1e-6)) / np.cos(theta)
        x = self.cx + extent / 6.0  # about a third of the heart lies right of the midline
        y = self.dome["L"] - 0.55 * self.heart_b
        return x, y, float(a), self.heart_b, self.heart_angle


def sample_patient(seed: int, patient: int, age: float, female: bool) -> Geometry:
    """The body of one patient: shared by all their images (only positioning and inspiration vary).

    Args:
        seed: master seed of the set.
        patient: global patient index (with ``seed`` it fixes the anatomy).
        age: years; older chests are a little wider with more unfolded aortas and lower bone density.
        female: narrower thorax, breast shadows.
    """
    rng = np.random.default_rng(np.random.SeedSequence([seed, 23, patient]))
    old = np.clip((age - 40.0) / 50.0, 0.0, 1.0)
    size = rng.normal(0.0, 1.0)  # overall habitus, drives thorax width and soft-tissue thickness
    hw = np.clip(0.355 + 0.018 * size - 0.015 * female + rng.normal(0, 0.008), 0.3, 0.42)
    apex = rng.uniform(0.13, 0.18)
    dome_r = rng.uniform(0.66, 0.73)
    med_hw = rng.uniform(0.05, 0.062)
    return Geometry(
        cx=0.5,
        hw=float(hw),
        width={"R": 1.0, "L": float(rng.uniform(0.97, 1.03))},
        apex=float(apex),
        dome={"R": float(dome_r), "L": float(dome_r + rng.uniform(0.012, 0.04))},
        depth={"R": float(rng.uniform(0.065, 0.1)), "L": float(rng.uniform(0.065, 0.1))},
        ctr=float(np.clip(rng.normal(0.445, 0.025) + 0.012 * old, 0.39, 0.495)),
        heart_b=float(rng.uniform(0.13, 0.155)),
        heart_angle=float(rng.uniform(8, 24)),
        med_hw=float(med_hw),
        knob=[
            float(med_hw + rng.uniform(-0.002, 0.01) + 0.006 * old),
            float(rng.uniform(0.3, 0.34)),
            float(rng.uniform(0.021, 0.03) + 0.005 * old),
        ],  # fmt: skip
        carina=float(rng.uniform(0.38, 0.42)),
        hilum={
            "R": [0.5 - rng.uniform(0.07, 0.085), rng.uniform(0.45, 0.49)],
            "L": [0.5 + rng.uniform(0.065, 0.08), rng.uniform(0.42, 0.46)],
        },  # fmt: skip
        body_hw=float(hw + np.clip(0.06 + 0.025 * size, 0.025, 0.11)),
        neck_hw=float(rng.uniform(0.075, 0.095)),
        clav_y=float(apex + rng.uniform(0.02, 0.05)),
        clav_tilt=float(rng.uniform(0.015, 0.05)),
        scapula=float(rng.uniform(0.0, 0.15)),
        rib_drop=float(rng.uniform(0.09, 0.13)),
        lung_air=float(rng.uniform(0.5, 0.6)),
        breast=float(rng.uniform(0.6, 1.0)) if female and rng.random() < 0.85 else 0.0,
        gastric=float(rng.uniform(0.018, 0.035)) if rng.random() < 0.8 else 0.0,
        bone=float(np.clip(1.05 - 0.2 * old + rng.normal(0, 0.05), 0.7, 1.15)),
        cortex=float(rng.uniform(0.4, 0.5)),
        scol_amp=float(rng.normal(0, 0.003)),
        hilum_scale=float(rng.uniform(0.9, 1.1)),
        aorta_unfold=float(np.clip(rng.uniform(0.0, 0.45) + 0.25 * old, 0.0, 0.7)),
        vessel_gain=float(rng.uniform(0.85, 1.15)),
    )


def image_geometry(base: Geometry, rng: np.random.Generator, view: str) -> Geometry:
    """One image of the patient: inspiration depth and patient rotation vary; AP magnifies the heart."""
    g = copy.deepcopy(base)
    breath = rng.normal(0.0, 0.012)  # deeper inspiration lowers both domes
    for side in SIDES:
        g.dome[side] += breath + rng.normal(0, 0.004)
    g.cx += rng.normal(0.0, 0.008)  # rotation moves the mediastinum relative to the chest wall
    g.hw *= 1.0 + rng.normal(0.0, 0.01)
    g.heart_angle += rng.normal(0.0, 2.0)
    if view == "AP":  # supine portable film: magnified heart, scapulae over the lungs, shallower breath
        g.ctr *= rng.uniform(1.08, 1.15)
        g.heart_b *= 1.05
        g.scapula = float(rng.uniform(0.6, 1.0))
        g.clav_y -= rng.uniform(0.0, 0.02)
        g.clav_tilt *= 0.5
        for side in SIDES:
            g.dome[side] -= 0.015
    return g


def lung_contour(g: Geometry, side: str) -> tuple[np.ndarray, dict[str, slice]]:
    """Outline of one lung ``(K, 2)`` (apex -> lateral wall -> costophrenic angle -> dome -> medial border).

    Returns:
        The closed polygon and the slices of its ``lateral``, ``dome`` and ``medial`` parts.
    """
    s, hw = SIGN[side], g.hw * g.width[side]
    cp = g.cp(side)
    y = np.linspace(g.apex, cp, 24)
    u = (y - g.apex) / (cp - g.apex)
    lateral = hw * (0.28 + 0.72 * np.sin(0.5 * np.pi * np.clip(u / 0.7, 0, 1)) ** 0.7)
    m = 0.03
    xo = np.linspace(hw, m, 20)[1:]
    xp = 0.5 * hw
    yd = np.where(
        xo > xp,
        g.dome[side] + g.depth[side] * ((xo - xp) / (hw - xp)) ** 2,
        g.dome[side] + 0.3 * g.depth[side] * ((xp - xo) / (xp - m)) ** 2,
    )
    ym = np.linspace(g.dome[side] + 0.3 * g.depth[side], g.apex, 18)[1:-1]
    medial = m + (0.28 * hw - m) * np.clip(1.0 - (ym - g.apex) / 0.09, 0, 1) ** 2
    pts = np.concatenate(
        [np.stack([g.cx + s * lateral, y], 1), np.stack([g.cx + s * xo, yd], 1), np.stack([g.cx + s * medial, ym], 1)]
    )
    parts = {"lateral": slice(0, 24), "dome": slice(23, 24 + len(xo)), "medial": slice(24 + len(xo), len(pts))}
    return pts, parts


def _body(g: Geometry, n: int) -> np.ndarray:
    """Soft-tissue path length through an elliptic torso ``(n, n)``, 1 at the midline."""
    X, Y = grid(n)
    ys = Y[:, 0]
    levels = [0.0, 0.04, 0.09, 0.16, 0.24, 0.4, 0.65, 1.0]  # neck, shoulders, axillae, chest wall, waist
    widths = [g.neck_hw, g.neck_hw * 1.2, 0.3, 0.44, 0.47, g.body_hw + 0.03, g.body_hw, g.body_hw * 0.94]
    bw = np.interp(ys, levels, widths)  # (n,) half-width of the body per row
    return np.clip(1.0 - ((X - g.cx) / bw[:, None]) ** 2, 0.0, 1.0) ** 0.3


def _mediastinum(scene: Scene, g: Geometry) -> np.ndarray:
    """Union of heart, upper mediastinum, aortic knob and pulmonary trunk as a uint8 mask ``(n, n)``."""
    canvas = scene.blank()
    hx, hy, a, b, ang = g.heart()
    cv2.ellipse(canvas, tuple(int(v) for v in scene.fixed((hx, hy))), tuple(int(v) for v in scene.fixed((a, b))),
                ang, 0, 360, 255, -1, cv2.LINE_AA, SHIFT)  # fmt: skip
    ys = np.linspace(-0.05, hy, 12)
    half = g.med_hw * (0.9 + 0.7 * np.clip((ys - g.carina) / (hy - g.carina), 0, 1) ** 1.5)
    band = np.concatenate([np.stack([g.cx - half, ys], 1), np.stack([g.cx + 1.05 * half, ys], 1)[::-1]])
    cv2.fillPoly(canvas, [scene.fixed(band)], 255, cv2.LINE_AA, SHIFT)
    dx, ky, r = g.knob
    circles = [((g.cx + dx, ky), r), ((g.cx + g.med_hw + 0.004, ky + 0.08), 0.02)]
    # the descending aorta below the knob; the more unfolded, the more it bulges into the left lung
    circles.append(((g.cx + dx - 0.006 + 0.016 * g.aorta_unfold, ky + 0.05), r * (0.6 + 0.35 * g.aorta_unfold)))
    for (x, y), rad in circles:
        cv2.circle(canvas, tuple(int(v) for v in scene.fixed((x, y))), int(rad * scene.n * ONE), 255, -1,
                   cv2.LINE_AA, SHIFT)  # fmt: skip
    return canvas


def _vessels(scene: Scene, g: Geometry, rng: np.random.Generator) -> np.ndarray:
    """Pulmonary vessel trees radiating from each hilum, as a float layer ``(n, n)``.

    Each of ``k`` trunks per lung forks twice (a binary tree of 7 segments) with tapering width and brightness,
    so markings fade towards the periphery as on a real film. A fixed number of random draws per image keeps
    the texture stream independent of the geometry.
    """
    canvas = scene.blank()
    k = 8
    for side in SIDES:
        s = SIGN[side]
        hx, hy = g.hilum[side]
        angles = np.linspace(-80, 80, k) + rng.uniform(-10, 10, k)  # from up-lateral to down-lateral, degrees
        turns = rng.uniform(-32, 32, (k, 7))  # per tree node: direction change
        lengths = rng.uniform(0.75, 1.15, (k, 7))
        span = 0.95 * g.hw * g.width[side] / max(0.7, g.vessel_crowd**0.5)
        roots = hy + np.linspace(-0.035, 0.035, k) + rng.uniform(-0.01, 0.01, k)  # trunks leave along the hilum
        for j in range(k):
            down = max(0.0, np.sin(np.deg2rad(angles[j])))
            base_w = 0.0075 * (0.75 + 0.55 * down) * g.vessel_gain * g.vessel_crowd**0.5
            # nodes: (start x, start y, direction, level, tree position)
            stack = [(hx - s * 0.01, roots[j], np.deg2rad(angles[j]), 0, 0)]
            while stack:
                x0, y0, direction, level, node = stack.pop()
                direction += np.deg2rad(turns[j, node]) * (0.4 if level == 0 else 1.0)
                length = span * (0.36, 0.3, 0.26)[level] * lengths[j, node]
                x1, y1 = x0 + s * np.cos(direction) * length, y0 + np.sin(direction) * length
                width = scene.px(base_w * (1.0, 0.55, 0.3)[level])
                value = (255, 190, 120)[level]
                cv2.line(canvas, tuple(int(v) for v in scene.fixed((x0, y0))),
                         tuple(int(v) for v in scene.fixed((x1, y1))), value, width, cv2.LINE_AA, SHIFT)  # fmt: skip
                if level < 2:
                    first = 2 * node + 1
                    stack.append((x1, y1, direction - np.deg2rad(14), level + 1, first))
                    stack.append((x1, y1, direction + np.deg2rad(14), level + 1, first + 1))
    return scene.as_float(canvas)


def render_anatomy(g: Geometry, n: int, labels: frozenset[str], rng: np.random.Generator) -> Scene:
    """Draw the normal thorax described by ``g`` on an ``n``-pixel canvas.

    Args:
        g: geometry, already altered by the image's findings.
        n: native canvas size.
        labels: the image's clean findings (kept on the scene for the draw rules).
        rng: texture stream (vessels, parenchymal and soft-tissue noise).
    """
    scene = Scene(n, g, labels)
    X, Y = grid(n)
    tissue = _body(g, n)  # (n, n) relative soft-tissue path length through the torso
    non_lung = np.clip(1.6 * scene.blur(scene.as_float(_mediastinum(scene, g)), 0.006) - 0.3, 0.0, 1.0)
    lungs, dome_x, dome_y = [], [], []
    for side in SIDES:
        pts, parts = lung_contour(g, side)
        scene.contour[side], scene.parts[side] = pts, parts
        scene.pleura[side] = scene.polygon(pts)
        lungs.append(scene.pleura[side])
        dome_x.append(pts[parts["dome"], 0])
        dome_y.append(pts[parts["dome"], 1])
    scene.lung = scene.blur(np.maximum(lungs[0], lungs[1]) * (1.0 - non_lung), 0.004)
    depth = np.sqrt(np.clip(1.0 - ((X - g.cx) / (1.06 * g.hw)) ** 2, 0.0, 1.0))  # lungs thin out laterally
    scene.air = g.lung_air * scene.lung * (0.5 + 0.5 * depth)
    hx, hy, a, b, ang = g.heart()
    heart = scene.ellipse((hx, hy), (a, b), ang)
    order = np.argsort(np.concatenate(dome_x))
    under = np.interp(X[0], np.concatenate(dome_x)[order], np.concatenate(dome_y)[order])  # (n,) dome line
    abdomen = scene.blur((under[None, :] < Y).astype(np.float32), 0.01)
    scene.density = (0.9 + 0.08 * abdomen + 0.06 * heart * (1.0 - abdomen)) * tissue - scene.air

    # trachea and main bronchi: an air column over the spine
    ys = np.linspace(-0.02, g.carina, 10)
    dev = g.trachea_dev * np.sin(np.pi * np.clip(ys / g.carina, 0, 1)) ** 0.8
    trachea = np.stack([g.cx + dev, ys], 1)
    airway = scene.lines([trachea], g.trachea_w)
    carina = (g.cx + 0.003, g.carina)
    bronchi = [np.array([carina, (g.hilum["R"][0] + 0.02, g.hilum["R"][1] - 0.01)]),
               np.array([carina, (g.hilum["L"][0] - 0.02, g.hilum["L"][1] - 0.005)])]  # fmt: skip
    airway = np.maximum(airway, scene.lines(bronchi, g.trachea_w * 0.6))
    scene.density -= 0.16 * scene.blur(airway, 0.003) * tissue

    if g.gastric > 0:  # gastric air under the left dome, flat fluid level below
        gx = g.cx + 0.55 * g.hw * g.width["L"]
        gy = g.dome["L"] + 0.35 * g.depth["L"] + 0.03 + 0.6 * g.gastric
        scene.density -= 0.35 * scene.blur(scene.ellipse((gx, gy), (1.5 * g.gastric, g.gastric), 0, 180, 360), 0.003)
    for side in SIDES:  # hila: pulmonary arteries and bronchi, denser than the surrounding lung
        hl = scene.ellipse(tuple(g.hilum[side]), (0.022 * g.hilum_scale, 0.04 * g.hilum_scale), SIGN[side] * 15)
        scene.opacify(scene.blur(hl, 0.012), 0.35)
    if g.breast > 0:
        for side in SIDES:
            s = SIGN[side]
            shadow = scene.ellipse((g.cx + s * 0.62 * g.hw, g.dome[side] - 0.03),
                                   (0.4 * g.hw, 0.11 * g.breast), s * -12, 0, 180)  # fmt: skip
            scene.density += 0.12 * g.breast * scene.blur(shadow, 0.02)

    scene.density += skeleton.draw_skeleton(scene, g)
    vessels = scene.blur(_vessels(scene, g, rng), 0.0025)
    parenchyma = 0.6 * scene.smooth_noise(rng, 10) + 0.4 * scene.smooth_noise(rng, 24)
    scene.texture = (0.13 * vessels * g.vessel_gain + 0.03 * parenchyma) * (g.lung_air / 0.55)
    scene.density += 0.015 * scene.smooth_noise(rng, 6) * tissue  # uneven soft tissue
    return scene
