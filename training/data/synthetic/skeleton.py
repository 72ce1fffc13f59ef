"""Bones of the frontal chest film: spine, posterior and anterior ribs, clavicles, scapulae.

Bones are drawn with a bright cortex and a fainter medulla (outer stroke minus inner stroke), so osteopenia can
thin the cortex and lower the density, and a fracture can interrupt and step the cortical line.
"""

from __future__ import annotations

import cv2
import numpy as np

from training.data.synthetic.scene import SHIFT, SIDES, SIGN, Scene


def spine_x(g, y):
    """x of the spinal axis at height(s) ``y``: midline plus the scoliotic curve (C for 1 wave, S for 2)."""
    u = np.clip((np.asarray(y) - 0.1) / 0.78, 0.0, 1.0)
    return g.cx + g.scol_amp * np.sin(np.pi * g.scol_waves * u)


def _bezier(p0, p1, p2, k: int) -> np.ndarray:
    t = np.linspace(0.0, 1.0, k)[:, None]
    return (1 - t) ** 2 * np.asarray(p0) + 2 * (1 - t) * t * np.asarray(p1) + t**2 * np.asarray(p2)


def _split_fractured(points: np.ndarray, fracture: dict) -> list[np.ndarray]:
    """Cut a rib centreline at ``fracture['t']`` (fraction of its length) and step the distal fragment."""
    seg = np.r_[0.0, np.cumsum(np.linalg.norm(np.diff(points, axis=0), axis=1))]
    t = seg / seg[-1]
    half = fracture["gap"] / seg[-1] / 2
    a, b = fracture["t"] - half, fracture["t"] + half

    def at(tt):
        return np.array([np.interp(tt, t, points[:, 0]), np.interp(tt, t, points[:, 1])])

    direction = at(b) - at(a)
    normal = np.array([-direction[1], direction[0]]) / (np.linalg.norm(direction) + 1e-9)
    proximal = np.vstack([points[t < a], at(a)])
    distal = np.vstack([at(b), points[t > b]]) + normal * fracture["step"]  # step-off across the rib
    fracture["xy"] = tuple(at(fracture["t"]))  # where the break is, for a callus or for tests
    return [proximal, distal]


def _vertebrae(scene: Scene, g) -> tuple[list[np.ndarray], list]:
    """Quadrilaterals of the vertebral bodies from C7 down, plus ``(x, y, hw, hh, angle)`` per body."""
    quads, bodies = [], []
    y = -0.03
    while y < 1.04:
        hump = np.exp(-(((y - 0.38) / 0.15) ** 2))
        step = 0.05 * (1.0 - 0.3 * g.kyphosis * hump)  # kyphosis foreshortens the mid-thoracic bodies
        yc = y + step / 2
        x = float(spine_x(g, yc))
        slope = float(spine_x(g, yc + 0.01) - spine_x(g, yc - 0.01)) / 0.02
        ang = np.arctan(slope)
        hw, hh = 0.022 + 0.014 * np.clip(yc, 0, 1), step * 0.39
        c, s = np.cos(ang), np.sin(ang)
        corners = np.array([[-hw, -hh], [hw, -hh], [hw, hh], [-hw, hh]])
        rot = np.array([[c, s], [-s, c]])  # tilt the body with the curve
        quads.append(corners @ rot.T + np.array([x, yc]))
        bodies.append((x, yc, hw, hh, float(np.rad2deg(ang))))
        y += step
    return quads, bodies


def _ribs(scene: Scene, g):
    """Posterior and anterior rib centrelines per side; fractured ribs come back in pieces."""
    posterior, anterior = [], []
    for side in SIDES:
        s = SIGN[side]
        lat = scene.contour[side][scene.parts[side]["lateral"]]
        spacing = (g.dome[side] - g.apex + 0.03) / 10.0
        for i in range(11):
            y0 = g.apex - 0.03 + i * spacing
            reach = abs(np.interp(y0 + 0.035, lat[:, 1], lat[:, 0]) - g.cx) + 0.012
            x0 = float(spine_x(g, y0)) + s * 0.014
            t = np.linspace(0.0, 1.0, 16)
            xs = x0 + t * (g.cx + s * reach - x0)
            ys = y0 - 0.045 * np.sin(np.pi * t**0.7) + (g.rib_drop + 0.07 * g.kyphosis) * t**3
            pts = np.stack([xs, ys], 1)
            scene.ribs.append((side, i, pts))
            pieces = [pts]
            for fracture in g.fractures:
                if fracture["side"] == side and fracture["rib"] == i:
                    pieces = _split_fractured(pts, fracture)
            posterior += pieces
            if i < 7:
                xe, ye = pts[-1]
                end = (g.cx + s * (0.09 + 0.012 * i), ye + 0.075 + 0.006 * i)
                anterior.append(_bezier((xe, ye), (xe - s * 0.06, ye + 0.03), end, 12))
    return posterior, anterior


def _cortical(scene: Scene, lines, width: float, cortex: float) -> tuple[np.ndarray, np.ndarray]:
    """Outer and inner strokes of tubular bones as float layers (cortex = outer - inner)."""
    outer, inner = scene.blank(), scene.blank()
    fixed = [scene.fixed(p) for p in lines]
    w = scene.px(width)
    cv2.polylines(outer, fixed, False, 255, w, cv2.LINE_AA, SHIFT)
    wi = int(round(w * (1.0 - 2.0 * cortex) + (1.0 - cortex)))  # thinner cortex -> wider medulla
    if wi >= 1:
        cv2.polylines(inner, fixed, False, 255, wi, cv2.LINE_AA, SHIFT)
    return scene.as_float(outer), scene.as_float(inner)


def draw_skeleton(scene: Scene, g) -> np.ndarray:
    """Bone density ``(n, n)`` for geometry ``g``; records vertebrae and ribs on the scene for bone rules."""
    quads, bodies = _vertebrae(scene, g)
    scene.vertebrae = bodies
    body = scene.blank()
    cv2.fillPoly(body, [scene.fixed(q) for q in quads], 255, cv2.LINE_AA, SHIFT)
    rim = scene.blank()
    cv2.polylines(rim, [scene.fixed(q) for q in quads], True, 255, 1, cv2.LINE_AA, SHIFT)
    for x, y, hw, hh, _ in bodies:  # pedicles: small cortical rings at the upper corners
        for s in (-1, 1):
            c = tuple(int(v) for v in scene.fixed((x + s * 0.6 * hw, y - 0.25 * hh)))
            axes = tuple(max(1, int(v)) for v in scene.fixed((0.22 * hw, 0.35 * hh)))
            cv2.ellipse(rim, c, axes, 0, 0, 360, 200, 1, cv2.LINE_AA, SHIFT)
    bone = 0.09 * scene.as_float(body) + 0.045 * g.cortex / 0.45 * scene.as_float(rim)

    posterior, anterior = _ribs(scene, g)
    outer, inner = _cortical(scene, posterior, 0.024, g.cortex)
    bone += 0.12 * outer - 0.055 * inner
    outer, inner = _cortical(scene, anterior, 0.018, g.cortex)
    bone += 0.04 * outer - 0.015 * inner

    clavicles = []
    for side in SIDES:
        s = SIGN[side]
        head = (g.cx + s * 0.035, g.clav_y + 0.015)
        tip = (g.cx + s * (g.hw + 0.08), g.clav_y - g.clav_tilt)
        clavicles.append(_bezier(head, (g.cx + s * 0.55 * g.hw, g.clav_y + 0.01), tip, 14))
    outer, inner = _cortical(scene, clavicles, 0.024, g.cortex)
    bone += 0.13 * outer - 0.05 * inner

    plates = scene.blank()
    rims = scene.blank()
    for side in SIDES:
        s = SIGN[side]
        hw = g.hw * g.width[side]
        blade = np.array([
            (g.cx + s * hw * (0.93 - 0.32 * g.scapula), g.apex - 0.02),
            (g.cx + s * hw * (1.0 - 0.25 * g.scapula), g.apex + 0.33),
            (g.cx + s * (hw + 0.11), g.clav_y + 0.05),
            (g.cx + s * (hw + 0.06), g.clav_y - 0.01),
        ])  # fmt: skip
        cv2.fillPoly(plates, [scene.fixed(blade)], 255, cv2.LINE_AA, SHIFT)
        cv2.polylines(rims, [scene.fixed(blade)], True, 255, 1, cv2.LINE_AA, SHIFT)
    bone += 0.06 * scene.as_float(plates) + 0.04 * scene.as_float(rims)
    return scene.blur(bone, 0.002) * g.bone
