"""Who is in the synthetic set and what they have: patients, splits, centres, views and labels.

Labels are sampled before anything is drawn, from a small generative model loosely shaped after PadChest:

* each patient gets an age, a sex and a latent *frailty*; every finding's log-odds depend on them, so findings
  cluster in old and sick patients (which is also what keeps ``Normal`` near a third of the images);
* co-occurrence rules (:data:`IMPLIES`) add children to parents (a central venous catheter is a support device,
  emphysema brings hyperinflation, ...), with the children's own base rate lowered so the marginal stays on target;
* follow-up images of a patient keep most findings (all chronic ones) and pick up a few new ones;
* the rarest classes get exact per-split quotas (see :func:`quota`), so every finding has at least
  ``min_positives_per_split`` positives in train, val *and* test while the very rare ones stay under 0.1 % of train;
* weak label noise (missed positives, a few false positives) is applied to the train split only, after which
  ``Normal`` is recomputed so it stays exclusive;
* ``Normal`` is a label of its own (docs/rules.md §12): positive on an image with none of the 36 findings, so an
  image whose only findings are Task 2's unseen ones is *not* normal, and its Task 1 row is all zero. On the train
  split a share ``unlabelled_rate`` of the finding-free images also carries no ``Normal`` label (an all-zero row:
  a report that gave no label, which the overview warns is not a confirmed normal). Validation and test stay clean.

Images are always drawn from the clean labels; the manifest carries the noisy train labels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from evaluation.groups import frequency_group
from training.data.findings import CXRLT_FINDINGS, TASK1_LABELS, TASK2_LABELS  # noqa: F401 (re-exported)

FINDINGS: tuple[str, ...] = CXRLT_FINDINGS
NORMAL = "Normal"
SPLITS: tuple[str, ...] = ("train", "val", "test")
INDEX = {name: i for i, name in enumerate(FINDINGS)}

# Target clean prevalence per image. Common classes sit well above 10 % so that they stay common after the
# missed-positive noise; medium ones at >= 1.3 % for the same reason. Below 1 % a class is quota-controlled.
PREVALENCE: dict[str, float] = {
    # common (> 10 %)
    "Support Devices": 0.18, "Aortic Elongation": 0.17, "Cardiomegaly": 0.155,
    "Vertebral Degenerative Changes": 0.165, "Pleural Effusion": 0.15,
    # medium (1-10 %)
    "Atelectasis": 0.065, "Interstitial Pattern": 0.06, "Alveolar Pattern": 0.055, "Nodule": 0.05,
    "Aortic Atheromatosis": 0.05, "Central Venous Catheter": 0.05, "Kyphosis": 0.04, "Pleural Thickening": 0.035,
    "Hemidiaphragm Elevation": 0.035, "Calcified Densities": 0.035, "Hyperinflated Lung": 0.03,
    "Emphysema": 0.03, "Sternotomy": 0.025, "Fracture": 0.022, "Hernia": 0.018,
    "Scoliosis": 0.03, "Osteopenia": 0.022,
    # rare (0.1-1 %)
    "Vascular Hilar Enlargement": 0.008, "Bronchiectasis": 0.007, "Mass": 0.006, "Hypoexpansion": 0.005,
    "Pneumothorax": 0.004, "Adenopathy": 0.008, "Bulla": 0.005, "Goiter": 0.003, "Infarction": 0.0025,
    # very rare (< 0.1 %)
    "Hydropneumothorax": 0.0005, "Pneumoperitoneum": 0.0005, "Azygos Lobe": 0.0006,
    "Subcutaneous Emphysema": 0.0006,
}  # fmt: skip
QUOTA_BELOW = 0.01  # classes rarer than this get exact per-split counts instead of Bernoulli draws

# Log-odds per decade of age above 60: degenerative, aortic and cardiac findings rise with age.
AGE_EFFECT: dict[str, float] = {
    "Vertebral Degenerative Changes": 0.8, "Kyphosis": 0.6, "Osteopenia": 0.7, "Aortic Elongation": 0.75,
    "Aortic Atheromatosis": 0.85, "Cardiomegaly": 0.45, "Pleural Effusion": 0.25, "Emphysema": 0.3,
    "Hyperinflated Lung": 0.2, "Hernia": 0.45, "Sternotomy": 0.3, "Calcified Densities": 0.2, "Fracture": 0.2,
    "Interstitial Pattern": 0.3, "Mass": 0.3, "Nodule": 0.2, "Goiter": 0.2, "Scoliosis": 0.25,
    "Pneumothorax": -0.2, "Azygos Lobe": 0.0,
}  # fmt: skip
FEMALE_EFFECT: dict[str, float] = {
    "Osteopenia": 0.8, "Goiter": 0.9, "Scoliosis": 0.4, "Pneumothorax": -0.6, "Emphysema": -0.3,
    "Aortic Atheromatosis": -0.2, "Sternotomy": -0.4,
}  # fmt: skip
# Frailty loading: how strongly a finding follows the latent "sick patient" factor (congenital ones do not).
FRAILTY_LOADING: dict[str, float] = {
    "Azygos Lobe": 0.0, "Scoliosis": 0.3, "Calcified Densities": 0.4, "Goiter": 0.4, "Kyphosis": 0.5,
    "Vertebral Degenerative Changes": 0.5, "Osteopenia": 0.6, "Aortic Elongation": 0.6,
}  # fmt: skip
DEFAULT_LOADING = 0.6

# (parent, child, P(child | parent)). Children listed after their parents in FINDINGS order is not required;
# :func:`_topological` orders them. A quota-controlled child is not forced; the rule raises its sampling weight.
IMPLIES: tuple[tuple[str, str, float], ...] = (
    ("Central Venous Catheter", "Support Devices", 1.0),
    ("Sternotomy", "Support Devices", 0.45),
    ("Sternotomy", "Cardiomegaly", 0.45),
    ("Emphysema", "Hyperinflated Lung", 0.55),
    ("Emphysema", "Bulla", 0.15),
    ("Pleural Effusion", "Atelectasis", 0.22),
    ("Pleural Effusion", "Cardiomegaly", 0.3),
    ("Alveolar Pattern", "Pleural Effusion", 0.2),
    ("Aortic Atheromatosis", "Aortic Elongation", 0.8),
    ("Kyphosis", "Vertebral Degenerative Changes", 0.5),
    ("Osteopenia", "Kyphosis", 0.25),
    ("Osteopenia", "Fracture", 0.1),
    ("Hypoexpansion", "Atelectasis", 0.3),
    ("Cardiomegaly", "Vascular Hilar Enlargement", 0.04),
    ("Interstitial Pattern", "Bronchiectasis", 0.06),
    ("Mass", "Adenopathy", 0.25),
    ("Pneumothorax", "Support Devices", 0.3),
    ("Pneumothorax", "Subcutaneous Emphysema", 0.1),
    ("Fracture", "Pneumothorax", 0.04),
    ("Hydropneumothorax", "Support Devices", 0.5),
    ("Pleural Effusion", "Infarction", 0.01),
)
# Findings that persist in a follow-up image (bones, surgery, aorta, congenital variants).
CHRONIC = frozenset({
    "Aortic Atheromatosis", "Aortic Elongation", "Azygos Lobe", "Calcified Densities", "Kyphosis", "Scoliosis",
    "Osteopenia", "Sternotomy", "Vertebral Degenerative Changes", "Goiter", "Emphysema", "Hyperinflated Lung",
    "Bulla", "Bronchiectasis", "Interstitial Pattern", "Cardiomegaly", "Hernia",
})  # fmt: skip


@dataclass(frozen=True)
class LabelConfig:
    """Parameters of the label sampler (all recorded in ``params.json``).

    Attributes:
        n_train, n_val, n_test: images per split.
        min_positives_per_split: every finding gets at least this many positives in every split.
        fn_rate: fraction of true positives reported as negative on train (missed findings).
        fp_rate: fraction of negatives reported as positive on train, for classes at >= ``fp_min_prevalence``
            (readers rarely hallucinate a rare finding, and this keeps the very-rare group very rare).
        images_per_patient: probabilities of a patient having 1, 2, 3 ... images.
        centre_b_fraction: share of patients imaged at centre_b, per split (test is balanced on purpose).
        ap_rate: share of AP views per centre, before the support-device (ICU) bump ``ap_if_devices``.
        unlabelled_rate: share of the train split's finding-free images written with ``Normal`` 0 too (all-zero,
            unlabelled rows); drawn from its own generator, so images and the other labels do not move with it.
    """

    n_train: int = 6000
    n_val: int = 1500
    n_test: int = 1500
    min_positives_per_split: int = 3
    fn_rate: float = 0.12
    fp_rate: float = 0.003
    fp_min_prevalence: float = 0.01
    images_per_patient: tuple[float, ...] = (0.72, 0.2, 0.08)
    centre_b_fraction: dict = field(default_factory=lambda: {"train": 0.15, "val": 0.15, "test": 0.5})
    ap_rate: dict = field(default_factory=lambda: {"centre_a": 0.12, "centre_b": 0.45})
    ap_if_devices: float = 0.3
    unlabelled_rate: float = 0.2

    def split_sizes(self) -> dict[str, int]:
        return {"train": self.n_train, "val": self.n_val, "test": self.n_test}


@dataclass
class LabelSample:
    """Everything known about each image before it is drawn; arrays are aligned, one row per image.

    Images are ordered split by split (train, val, test) and, within a split, patient by patient.
    """

    split: np.ndarray  # (N,) str
    patient: np.ndarray  # (N,) int, global patient index (unique across splits)
    visit: np.ndarray  # (N,) int, 0 for a patient's first image
    age: np.ndarray  # (N,) float years, at the patient's first image
    female: np.ndarray  # (N,) bool
    source: np.ndarray  # (N,) str, centre_a / centre_b
    view: np.ndarray  # (N,) str, PA / AP
    clean: np.ndarray  # (N, C) uint8, the truth the image is drawn from
    labels: np.ndarray  # (N, C) uint8, the manifest labels (noisy on train, clean elsewhere)
    noise: dict  # realised noise counts

    def __len__(self) -> int:
        return len(self.split)


def quota(name: str, split: str, n_split: int, min_positives: int) -> int | None:
    """Exact positive count of a quota-controlled class in one split, or None for Bernoulli-sampled classes.

    Classes under :data:`QUOTA_BELOW` get ``max(min_positives, round(p * n))`` positives. A very-rare class
    (p < 0.1 %) is additionally capped on train just below 0.1 % of the split, so it stays very rare as long as
    the train split holds more than ``1000 * min_positives`` images (the 6000-image default does).
    """
    p = PREVALENCE.get(name, 0.0)
    if name == NORMAL or p >= QUOTA_BELOW:
        return None
    count = round(p * n_split)
    if split == "train" and p < 0.001:
        count = min(count, math.ceil(0.001 * n_split) - 1)
    return max(min_positives, count)


def _topological(rules) -> list[str]:
    """Findings ordered so every parent of an implication comes before its children."""
    order, seen = [], set()

    def visit(name, stack=()):
        if name in seen:
            return
        if name in stack:
            raise ValueError(f"cycle in co-occurrence rules at {name}")
        for parent, child, _ in rules:
            if child == name:
                visit(parent, stack + (name,))
        seen.add(name)
        order.append(name)

    for name in FINDINGS:
        visit(name)
    return order


ORDER = _topological(IMPLIES)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _patients(rng, cfg: LabelConfig, n_images: int):
    """Image counts per patient for one split: ``(P,)`` counts summing exactly to ``n_images``."""
    probs = np.asarray(cfg.images_per_patient, dtype=float)
    probs = probs / probs.sum()
    counts = rng.choice(np.arange(1, len(probs) + 1), size=max(n_images, 1), p=probs)
    cum = np.cumsum(counts)
    n_pat = int(np.searchsorted(cum, n_images) + 1)
    counts = counts[:n_pat].copy()
    counts[-1] -= int(cum[n_pat - 1] - n_images)  # truncate the last patient's follow-ups
    return counts[counts > 0]


def _calibrate(logit_offsets: np.ndarray, target: float) -> float:
    """Intercept b with mean(sigmoid(b + offsets)) == target (bisection; offsets ``(N,)``)."""
    lo, hi = -20.0, 10.0
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        if _sigmoid(mid + logit_offsets).mean() < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _apply_implications(labels: np.ndarray, rng, rows: np.ndarray, quota_classes: set) -> None:
    """OR each non-quota child into ``labels[rows]`` where its parent is present, in topological order."""
    draws = rng.random((len(rows), len(IMPLIES)))  # fixed shape: determinism does not depend on the labels
    for name in ORDER:
        for r, (parent, child, prob) in enumerate(IMPLIES):
            if child == name and child not in quota_classes:
                add = (labels[rows, INDEX[parent]] == 1) & (draws[:, r] < prob)
                labels[rows[add], INDEX[child]] = 1


FINDING_INDEX = [INDEX[n] for n in FINDINGS if n != NORMAL]  # every finding, Task 2's unseen six included


def _recompute_normal(labels: np.ndarray) -> None:
    """``Normal`` = 1 exactly when none of the 36 findings is positive (in place, ``(N, C)``).

    Not "no Task 1 finding": an image with only an unseen finding (a scoliosis) is abnormal, and calling it normal
    would teach Task 1's ``Normal`` the very confusion the overview warns about.
    """
    labels[:, INDEX[NORMAL]] = (labels[:, FINDING_INDEX].sum(axis=1) == 0).astype(np.uint8)


def sample_labels(cfg: LabelConfig, seed: int) -> LabelSample:
    """Sample patients, splits, centres, views, clean labels and train label noise.

    Args:
        cfg: sampler parameters.
        seed: master seed; the sample depends on nothing else.

    Returns:
        A :class:`LabelSample` with one row per image.
    """
    rng = np.random.default_rng(np.random.SeedSequence([seed, 11]))
    sizes = cfg.split_sizes()
    n = sum(sizes.values())
    # --- patients --------------------------------------------------------------------------------------------
    split, patient, visit, centre_b = [], [], [], []
    first = 0
    for name in SPLITS:
        counts = _patients(rng, cfg, sizes[name])
        is_b = rng.random(len(counts)) < cfg.centre_b_fraction[name]
        for j, k in enumerate(counts):
            split += [name] * k
            patient += [first + j] * k
            visit += list(range(k))
            centre_b += [bool(is_b[j])] * k
        first += len(counts)
    split, patient, visit = np.array(split), np.array(patient), np.array(visit)
    n_pat = first
    p_age = np.clip(rng.normal(60.0, 17.0, n_pat), 18, 95)
    p_female = rng.random(n_pat) < 0.5
    p_frail = rng.normal(0.0, 1.0, n_pat)
    age = p_age[patient]  # age at the patient's first image (the anatomy is the patient's)
    female, frail = p_female[patient], p_frail[patient]
    source = np.where(np.array(centre_b), "centre_b", "centre_a")

    # --- clean labels ------------------------------------------------------------------------------------------
    C = len(FINDINGS)
    offsets = np.zeros((n, C))
    for c, name in enumerate(FINDINGS):
        offsets[:, c] = (
            AGE_EFFECT.get(name, 0.0) * (age + 0.7 * visit - 60.0) / 10.0  # follow-ups come a little later
            + FEMALE_EFFECT.get(name, 0.0) * (female - 0.5)
            + FRAILTY_LOADING.get(name, DEFAULT_LOADING) * frail
        )
    quota_classes = {name for name in FINDINGS if name != NORMAL and PREVALENCE[name] < QUOTA_BELOW}
    intercept = np.zeros(C)
    for c, name in enumerate(FINDINGS):
        if name == NORMAL:
            continue
        target, keep = PREVALENCE[name], 1.0
        for parent, child, prob in IMPLIES:
            if child == name and name not in quota_classes:
                keep *= 1.0 - PREVALENCE[parent] * prob
        base = max(1.0 - (1.0 - target) / keep, 0.25 * target)  # own rate so that the marginal hits target
        intercept[c] = _calibrate(offsets[:, c], base / 1.08)  # follow-ups add ~8 %
    propensity = _sigmoid(intercept + offsets)  # (N, C)
    fresh = (rng.random((n, C)) < propensity).astype(np.uint8)
    labels = fresh.copy()
    keep_p = np.array([1.0 if name in CHRONIC else 0.75 for name in FINDINGS])
    for k in range(1, int(visit.max()) + 1):
        rows = np.flatnonzero(visit == k)  # a follow-up directly follows the patient's previous image
        keep = rng.random((len(rows), C)) < keep_p
        new = rng.random((len(rows), C)) < 0.3
        labels[rows] = (labels[rows - 1] & keep) | (fresh[rows] & new)
    labels[:, INDEX[NORMAL]] = 0
    split_rows = {name: np.flatnonzero(split == name) for name in SPLITS}
    for name in ORDER:  # quota classes, parents first so their presence can steer the children's weights
        if name not in quota_classes:
            continue
        c = INDEX[name]
        labels[:, c] = 0
        weight = propensity[:, c].copy()
        for parent, child, prob in IMPLIES:
            if child == name:
                weight *= 1.0 + 40.0 * prob * labels[:, INDEX[parent]]
        for s in SPLITS:
            rows = split_rows[s]
            k = min(quota(name, s, len(rows), cfg.min_positives_per_split), len(rows))
            w = weight[rows] / weight[rows].sum()
            labels[rng.choice(rows, size=k, replace=False, p=w), c] = 1
    _apply_implications(labels, rng, np.arange(n), quota_classes)
    for s in SPLITS:  # top up Bernoulli classes that came out short in a small split
        rows = split_rows[s]
        for c, name in enumerate(FINDINGS):
            short = cfg.min_positives_per_split - int(labels[rows, c].sum())
            if name == NORMAL or name in quota_classes or short <= 0:
                continue
            free = rows[labels[rows, c] == 0]
            w = propensity[free, c] / propensity[free, c].sum()
            labels[rng.choice(free, size=min(short, len(free)), replace=False, p=w), c] = 1
        _apply_implications(labels, rng, rows, quota_classes)
    _recompute_normal(labels)
    _ensure_normals(labels, rng, split_rows, cfg.min_positives_per_split, quota_classes)
    clean = labels

    # --- views: AP is the portable/ICU film, more frequent at centre_b and with support devices ---------------
    ap_p = np.where(source == "centre_b", cfg.ap_rate["centre_b"], cfg.ap_rate["centre_a"])
    ap_p = np.clip(ap_p + cfg.ap_if_devices * clean[:, INDEX["Support Devices"]], 0, 0.95)
    view = np.where(rng.random(n) < ap_p, "AP", "PA")

    noisy, noise = _add_noise(clean, rng, split_rows["train"], cfg)
    noise["unlabelled"] = _unlabel_normals(
        noisy, split_rows["train"], cfg.unlabelled_rate, cfg.min_positives_per_split, seed
    )
    return LabelSample(split, patient, visit, age, female, source, view, clean, noisy, noise)


def _unlabel_normals(labels: np.ndarray, train_rows: np.ndarray, rate: float, min_positives: int, seed: int) -> int:
    """Clear ``Normal`` on a share ``rate`` of the train split's Normal rows (in place); returns how many.

    The rows become all-zero: unlabelled, not negative for Normal, which is how training reads them
    (docs/rules.md §12). The draw has its own generator so that it moves nothing else of the sample, and it keeps
    ``min_positives`` labelled Normal images, like every other class.
    """
    rng = np.random.default_rng(np.random.SeedSequence([seed, 12]))
    normal = train_rows[labels[train_rows, INDEX[NORMAL]] == 1]
    chosen = normal[rng.random(len(normal)) < rate][: max(0, len(normal) - min_positives)]
    labels[chosen, INDEX[NORMAL]] = 0
    return int(len(chosen))


def _ensure_normals(labels, rng, split_rows, min_positives, quota_classes) -> None:
    """Guarantee ``min_positives`` Normal images per split (only binds for tiny splits)."""
    task1 = FINDING_INDEX
    quota_idx = [INDEX[n] for n in quota_classes]
    for rows in split_rows.values():
        short = min_positives - int(labels[rows, INDEX[NORMAL]].sum())
        if short <= 0:
            continue
        free = rows[(labels[rows][:, quota_idx].sum(axis=1) == 0) & (labels[rows, INDEX[NORMAL]] == 0)]
        pick = rng.choice(free, size=min(short, len(free)), replace=False)
        labels[np.ix_(pick, task1)] = 0
        labels[pick, INDEX[NORMAL]] = 1


def _add_noise(clean: np.ndarray, rng, train_rows: np.ndarray, cfg: LabelConfig):
    """Train-only label noise; returns ``(noisy (N, C), realised counts)``. Val/test rows stay clean."""
    noisy = clean.copy()
    C = clean.shape[1]
    u_fn = rng.random((len(train_rows), C))
    u_fp = rng.random((len(train_rows), C))
    u_order = rng.random((len(train_rows), C))
    n_fn = n_fp = 0
    for c, name in enumerate(FINDINGS):
        if name == NORMAL:
            continue
        col = clean[train_rows, c]
        pos = np.flatnonzero(col == 1)
        flip = pos[u_fn[pos, c] < cfg.fn_rate]
        allowed = max(0, len(pos) - cfg.min_positives_per_split)  # never drop a class below the floor
        if len(flip) > allowed:
            flip = flip[np.argsort(u_order[flip, c])[:allowed]]
        noisy[train_rows[flip], c] = 0
        n_fn += len(flip)
        if col.mean() >= cfg.fp_min_prevalence:
            neg = np.flatnonzero(col == 0)
            add = neg[u_fp[neg, c] < cfg.fp_rate]
            noisy[train_rows[add], c] = 1
            n_fp += len(add)
    _recompute_normal(noisy)
    changed_normal = int((noisy[:, INDEX[NORMAL]] != clean[:, INDEX[NORMAL]]).sum())
    return noisy, {"false_negatives": n_fn, "false_positives": n_fp, "normal_changed": changed_normal}


def count_table(sample: LabelSample) -> list[dict]:
    """Per-class positives per split and train prevalence/group of the manifest labels (for reports/tests)."""
    rows = []
    masks = {s: sample.split == s for s in SPLITS}
    for c, name in enumerate(FINDINGS):
        row = {"finding": name}
        for s in SPLITS:
            row[s] = int(sample.labels[masks[s], c].sum())
        p = row["train"] / max(1, int(masks["train"].sum()))
        row["train_prevalence"] = p
        row["group"] = frequency_group(name, p)
        rows.append(row)
    return rows
