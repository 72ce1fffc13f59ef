"""The canvas every anatomy and finding rule draws on: density layers plus small drawing helpers.

The image is modelled as an X-ray *density* map (how much the beam is attenuated, 0 = air outside the body).
Anatomy adds soft tissue and bone and removes density where the lungs hold air; findings add or remove density
(an opacity fills air, a lucency adds air, metal adds a lot). Only at the very end is density turned into film
brightness (see :mod:`centres`). Working in density keeps overlapping structures additive, as on a real film:
a rib stays visible through an effusion, a nodule behind the heart is faint.

Coordinates are normalised: ``x`` and ``y`` in [0, 1] across the square canvas, ``x`` growing to the image right,
which is the *patient's left* (radiological convention). Side ``"R"`` (patient right) is the image left.
"""

from __future__ import annotations

from functools import lru_cache

import cv2
import numpy as np

SHIFT = 4  # OpenCV fixed-point bits: sub-pixel positions for smooth drawing at low resolution
ONE = 1 << SHIFT
SIDES = ("R", "L")
SIGN = {"R": -1.0, "L": 1.0}  # direction of the patient's side in image x


@lru_cache(maxsize=8)
def grid(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Normalised pixel-centre coordinates ``X, Y``, each ``(n, n)`` float32 (cached per size, read-only)."""
    axis = (np.arange(n, dtype=np.float32) + 0.5) / n
    X, Y = np.meshgrid(axis, axis)
    X.setflags(write=False)
    Y.setflags(write=False)
    return X, Y


class Scene:
    """Layers of one radiograph at native resolution ``n`` plus what rules need to know about the anatomy.

    Attributes:
        n: canvas size in pixels.
        geom: the :class:`anatomy.Geometry` the anatomy was drawn from.
        labels: clean positive findings of this image (a rule may adapt, e.g. devices next to a catheter).
        density: ``(n, n)`` float32 attenuation without lung markings.
        texture: ``(n, n)`` float32 lung markings (vessels, parenchymal noise), multiplied by the lung mask at the
            end; rules that remove markings (pneumothorax, bulla) scale it down.
        air: ``(n, n)`` float32 density removed by lung air; an opacity of strength 1 puts exactly this back.
        lung: ``(n, n)`` float32 soft mask of aerated lung (both sides).
        pleura: side -> ``(n, n)`` float32 mask of the whole pleural space, heart included (effusion fills it).
        contour: side -> ``(K, 2)`` lung outline, with index ranges in ``parts`` (``lateral``, ``dome``, ``medial``).
        vertebrae: list of ``(x, y, half_width, half_height, angle_deg)`` for bone rules.
        ribs: list of ``(side, index, (K, 2) posterior-rib centreline)``.
    """

    def __init__(self, n: int, geom, labels: frozenset[str]):
        self.n = n
        self.geom = geom
        self.labels = labels
        self.density = np.zeros((n, n), np.float32)
        self.texture = np.zeros((n, n), np.float32)
        self.air = np.zeros((n, n), np.float32)
        self.lung = np.zeros((n, n), np.float32)
        self.pleura: dict[str, np.ndarray] = {}
        self.contour: dict[str, np.ndarray] = {}
        self.parts: dict[str, dict[str, slice]] = {}
        self.vertebrae: list[tuple[float, float, float, float, float]] = []
        self.ribs: list[tuple[str, int, np.ndarray]] = []
        self._lung_points: dict = {}

    # --- conversions -------------------------------------------------------------------------------------------
    def fixed(self, points) -> np.ndarray:
        """Normalised ``(K, 2)`` points -> OpenCV fixed-point int32 pixel coordinates."""
        return np.round(np.asarray(points, dtype=np.float64) * (self.n * ONE)).astype(np.int32)

    def px(self, length: float, minimum: int = 1) -> int:
        """Normalised length -> integer pixel thickness (at least ``minimum``)."""
        return max(minimum, int(round(length * self.n)))

    # --- drawing into fresh [0, 1] layers (uint8 underneath for anti-aliasing) ---------------------------------
    def blank(self) -> np.ndarray:
        return np.zeros((self.n, self.n), np.uint8)

    @staticmethod
    def as_float(layer: np.ndarray) -> np.ndarray:
        return layer.astype(np.float32) * (1.0 / 255.0)

    def lines(self, polylines, width: float, closed: bool = False, layer=None) -> np.ndarray:
        """Anti-aliased polylines (list of ``(K, 2)`` arrays) of normalised ``width``; returns a float layer."""
        canvas = self.blank() if layer is None else layer
        cv2.polylines(canvas, [self.fixed(p) for p in polylines], closed, 255, self.px(width), cv2.LINE_AA, SHIFT)
        return self.as_float(canvas) if layer is None else canvas

    def polygon(self, points) -> np.ndarray:
        """Filled polygon as a float layer."""
        canvas = self.blank()
        cv2.fillPoly(canvas, [self.fixed(points)], 255, cv2.LINE_AA, SHIFT)
        return self.as_float(canvas)

    def ellipse(self, center, axes, angle: float = 0.0, start: float = 0.0, end: float = 360.0, width=None):
        """Filled (``width=None``) or outlined ellipse/arc as a float layer; ``axes`` are normalised semi-axes."""
        canvas = self.blank()
        thickness = -1 if width is None else self.px(width)
        c = tuple(int(v) for v in self.fixed(center))
        a = tuple(max(1, int(v)) for v in self.fixed(axes))
        cv2.ellipse(canvas, c, a, float(angle), float(start), float(end), 255, thickness, cv2.LINE_AA, SHIFT)
        return self.as_float(canvas)

    def blur(self, layer: np.ndarray, sigma: float) -> np.ndarray:
        """Gaussian blur with a normalised sigma (skipped below a tenth of a pixel)."""
        s = sigma * self.n
        return cv2.GaussianBlur(layer, (0, 0), s) if s > 0.1 else layer

    def smooth_noise(self, rng: np.random.Generator, cells: int) -> np.ndarray:
        """Band-limited noise ``(n, n)`` with roughly ``cells`` blobs across, zero mean, unit-ish amplitude."""
        coarse = rng.standard_normal((cells + 3, cells + 3)).astype(np.float32)
        size = self.n + 3 * self.n // cells
        big = cv2.resize(coarse, (size, size), interpolation=cv2.INTER_CUBIC)
        o = self.n // cells
        return big[o : o + self.n, o : o + self.n]

    # --- physics-flavoured edits ---------------------------------------------------------------------------------
    def opacify(self, mask: np.ndarray, amount: float) -> None:
        """Fill lung air under ``mask`` (float ``(n, n)``); ``amount`` 1 = as dense as soft tissue."""
        m = np.clip(mask * amount, 0.0, 1.0)
        self.density += self.air * m
        self.texture *= 1.0 - m

    def add(self, mask: np.ndarray, amount: float) -> None:
        """Add density (bone, calcium, metal); negative ``amount`` adds air (lucency)."""
        self.density += mask * amount

    def clear_markings(self, mask: np.ndarray, amount: float = 1.0) -> None:
        """Remove lung markings under ``mask`` (avascular areas)."""
        self.texture *= 1.0 - np.clip(mask * amount, 0.0, 1.0)

    # --- where things are ----------------------------------------------------------------------------------------
    def lung_point(self, rng: np.random.Generator, side: str | None = None, zone=(0.0, 1.0), peripheral=None):
        """A random normalised ``(x, y)`` inside aerated lung.

        Args:
            side: ``"R"``, ``"L"`` or None (either).
            zone: vertical band as fractions of the lung height (0 = apex, 1 = costophrenic angle).
            peripheral: None, or ``(lo, hi)`` band of lateral position (0 = medial border, 1 = chest wall).
        """
        key = side or "both"
        if key not in self._lung_points:
            masks = [self.pleura[s] * (self.lung > 0.6) for s in ((side,) if side else SIDES)]
            ys, xs = np.nonzero(np.maximum.reduce(masks) > 0.5)
            self._lung_points[key] = ((xs + 0.5) / self.n, (ys + 0.5) / self.n)
        xs, ys = self._lung_points[key]
        g = self.geom
        top, bottom = g.apex, max(g.dome["R"] + g.depth["R"], g.dome["L"] + g.depth["L"])
        u = (ys - top) / (bottom - top)
        keep = (u >= zone[0]) & (u <= zone[1])
        if peripheral is not None:
            lat = np.abs(xs - g.cx) / g.hw
            keep &= (lat >= peripheral[0]) & (lat <= peripheral[1])
        idx = np.flatnonzero(keep)
        if len(idx) == 0:
            idx = np.arange(len(xs))
        if len(idx) == 0:  # degenerate canvas; centre of the right lung
            return g.cx - 0.5 * g.hw, 0.5
        j = idx[rng.integers(len(idx))]
        return float(xs[j]), float(ys[j])
