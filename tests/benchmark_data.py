"""Small stand-ins for the benchmark tests: a Kermany-shaped image folder, a tiny random open_clip model, and a toy
protocol of another shape (image pairs, two findings, three readers, two sites, extras beyond its table) that plugs
into the same runner."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import cv2
import numpy as np
import pandas as pd

from apps.benchmarks.framework.encoders import Encoder, Target
from apps.benchmarks.framework.protocol import (
    Box,
    Draw,
    Extras,
    Features,
    Outcome,
    Prediction,
    Protocol,
    Subset,
    Targets,
)

TINY_CLIP = {
    "model_cfg": {
        "embed_dim": 16,
        "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "head_width": 16, "patch_size": 8},
        "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 16, "heads": 2, "layers": 1},
    },
    "preprocess_cfg": {"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]},
}


def write_tiny_clip(folder: Path) -> str:
    """A weightless open_clip config (random init, about 1 M parameters); returns its ``clip:local-dir:`` spec."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "open_clip_config.json").write_text(json.dumps(TINY_CLIP))
    return f"clip:local-dir:{folder}"


def write_kermany(root: Path, train: tuple[int, int] = (140, 380), test: tuple[int, int] = (45, 75),
                  shared: int = 2, size: int = 24, seed: int = 0, shared_films: int = 1) -> dict:  # fmt: skip
    """Write tiny JPEGs in the release layout ``{train,test}/{NORMAL,PNEUMONIA}/``, in the release's name shapes.

    Pneumonia images are brighter on average, so a probe has something to learn. The first ``shared`` test
    patients of each label also get ``shared_films`` images in the train folder (what the leakage rule must
    remove when that patient is among a version's test images).

    Args:
        root: the folder to create.
        train: (normal, pneumonia) images in the train folder, not counting the shared-patient ones.
        test: (normal, pneumonia) images in the test folder.
        shared: test patients per label that also have a train image.
        size: image side in pixels.
        seed: pixel noise seed.
        shared_films: train-folder images of each shared patient.

    Returns:
        ``{"shared_patients": [...], "shared_files": [...]}`` (the train files of the shared patients).
    """
    rng = np.random.default_rng(seed)

    def write(rel: str, positive: bool) -> None:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        base = 150 if positive else 90
        cv2.imwrite(str(path), np.clip(rng.normal(base, 30, (size, size)), 0, 255).astype(np.uint8))

    def names(label: str, count: int, start: int) -> list[tuple[str, str]]:
        """(file name, patient number) pairs in the release's shapes."""
        out = []
        for i in range(start, start + count):
            if label == "PNEUMONIA":
                kind = ("bacteria", "virus")[i % 2]
                name = f"person{i}_{kind}_{i * 3}.jpeg" if i % 7 else f"person{i}_{kind}_{i}_{i + 1}.jpeg"
                out.append((name, f"person{i}"))
            elif i % 2:
                out.append((f"IM-{i:04d}-0001.jpeg", f"IM-{i:04d}"))
            else:
                out.append((f"NORMAL2-IM-{i:04d}-0001-0002.jpeg", f"NORMAL2-IM-{i:04d}"))
        return out

    shared_patients, shared_files = [], []
    for label, (n_train, n_test) in zip(("NORMAL", "PNEUMONIA"), zip(train, test, strict=True), strict=True):
        test_names = names(label, n_test, start=1)
        for name, _ in test_names:
            write(f"test/{label}/{name}", label == "PNEUMONIA")
        for name, _ in names(label, n_train, start=10_000):
            write(f"train/{label}/{name}", label == "PNEUMONIA")
        for name, patient in test_names[:shared]:  # the same patient, other films, filed in the train folder
            for k in range(shared_films):
                other = (
                    f"{patient}_bacteria_{99999 - k}.jpeg" if label == "PNEUMONIA" else f"{name[:-5]}-{9 + k:04d}.jpeg"
                )
                write(f"train/{label}/{other}", label == "PNEUMONIA")
                shared_files.append(f"train/{label}/{other}")
            shared_patients.append(patient)
    return {"shared_patients": shared_patients, "shared_files": shared_files}


# --- a toy protocol of another shape -----------------------------------------------------------------------------

FINDINGS = ("Effusion", "Edema")
CHANGE_MARGIN = 0.05
"""The toy model calls a finding worse when its score rose by more than this (film noise moves it far less)."""
READERS = ("reader_a", "reader_b", "reader_c")
PAIR_SIZE = 16


def toy_site(i: int) -> str:
    """Where item ``i`` was read: runs of three, so each site holds every combination of the two findings."""
    return ("ward", "clinic")[(i // 3) % 2]


def toy_truth(i: int) -> tuple[int, int]:
    """Whether Effusion and Edema worsened between item ``i``'s prior and current film."""
    return int(i % 2 == 0), int((i // 2) % 2 == 0)


def toy_reading(i: int, reader: str) -> tuple[int, int]:
    """A reader's call: reader_a is always right, reader_b misreads Effusion on every 4th item (from 1), reader_c
    misreads Edema on every 3rd (from 0); so at most one reader errs per finding and the majority is the truth."""
    effusion, edema = toy_truth(i)
    if reader == "reader_b" and i % 4 == 1:
        effusion = 1 - effusion
    if reader == "reader_c" and i % 3 == 0:
        edema = 1 - edema
    return effusion, edema


def write_pairs(root: Path, n: int = 24, seed: int = 0) -> None:
    """``n`` prior/current PNG pairs and ``readings.csv``: the current film's left half (Effusion) or right half
    (Edema) is brighter than the prior's exactly when that finding worsened."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        prior = np.full((PAIR_SIZE, PAIR_SIZE), 80.0)
        current = prior.copy()
        effusion, edema = toy_truth(i)
        current[:, : PAIR_SIZE // 2] += 60 * effusion
        current[:, PAIR_SIZE // 2 :] += 60 * edema
        for name, image in (("prior", prior), ("current", current)):
            path = root / "pairs" / f"{i:03d}_{name}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            cv2.imwrite(str(path), np.clip(image + rng.normal(0, 3, image.shape), 0, 255).astype(np.uint8))
        row = {
            "item_id": f"study{i:03d}",
            "prior_path": f"pairs/{i:03d}_prior.png",
            "path": f"pairs/{i:03d}_current.png",
            "site": toy_site(i),
        }
        for reader in READERS:
            row.update(
                {f"{reader}_{finding}": value for finding, value in zip(FINDINGS, toy_reading(i, reader), strict=True)}
            )
        rows.append(row)
    pd.DataFrame(rows).to_csv(root / "readings.csv", index=False)


def cohen_kappa(a: np.ndarray, b: np.ndarray) -> float:
    """Agreement beyond chance of two 0/1 raters; NaN when chance agreement is already certain."""
    a, b = np.asarray(a).astype(bool), np.asarray(b).astype(bool)
    observed = np.mean(a == b)
    chance = a.mean() * b.mean() + (1 - a.mean()) * (1 - b.mean())
    return float((observed - chance) / (1 - chance)) if chance < 1 else float("nan")


class ToyProgressionProtocol(Protocol):
    """Did each finding worsen between the prior and the current film? Three readers, their majority the
    reference; the model and each reader are scored by Cohen's kappa against it, bootstrapped over studies.

    The model's call is whether its zero-shot score rose from the prior to the current film by more than
    :data:`CHANGE_MARGIN`, per finding: one encoder for both findings, two image columns per item. Beyond the
    table it reports each method's mean kappa per site (a table, a report section), a bar figure and the weakest
    reader's mean kappa (a metric).
    """

    methods = {"model": "Model", **{reader: reader.replace("_", " ").title() for reader in READERS}}

    def __init__(self, name: str, description: str, seed: int, versions: Mapping[str, int | None],
                 findings: list[str], prompts: Mapping[str, str], bootstrap: str = "plain"):  # fmt: skip
        super().__init__(name, description, seed, versions, bootstrap)
        self.findings = tuple(findings)
        self._targets = tuple(Target(f, prompts[f], f"a chest x-ray without {f.lower()}") for f in self.findings)

    @property
    def targets(self) -> tuple[Target, ...]:
        return self._targets

    @property
    def metrics(self) -> dict[str, str]:
        return {**{f"kappa_{f.lower()}": f"Kappa, {f}" for f in self.findings}, "kappa_mean": "Mean kappa"}

    def draw(self, root: Path, version: str) -> Draw:
        table = pd.read_csv(root / "readings.csv").sort_values("item_id", ignore_index=True)
        size = self.versions[version]
        table = table if size is None else table.head(size)
        readings = np.stack(
            [table[[f"{reader}_{f}" for f in self.findings]].to_numpy() for reader in READERS], axis=1
        )  # (N, R, K)
        majority = (readings.sum(axis=1) * 2 > len(READERS)).astype(int)  # (N, K)
        half = PAIR_SIZE // 2
        boxes = tuple(
            tuple(Box(f, k * half, 0, half, PAIR_SIZE, PAIR_SIZE, PAIR_SIZE, reader="reader_a")
                  for k, f in enumerate(self.findings) if readings[i, 0, k])
            for i in range(len(table))
        )  # fmt: skip
        words = np.where(majority == 1, "worse", "stable")  # (N, K)
        texts = tuple("; ".join(f"{f.lower()} {w}" for f, w in zip(self.findings, row, strict=True)) for row in words)
        targets = Targets("multilabel", self.findings, majority, readers=READERS, reader_labels=readings,
                          boxes=boxes, texts=texts, groups=table["site"].to_numpy())  # fmt: skip
        test = Subset(table, targets, images=("prior_path", "path"), id_column="item_id", pool=len(table))
        return Draw(version, {"test": test}, {"readers": len(READERS)}, [f"test: {len(test)} studies"])

    def predict(self, draw: Draw, encoder: Encoder, features: Features) -> Outcome:
        change = np.stack(
            [features.zero_shot(f, "test", "path") - features.zero_shot(f, "test", "prior_path")
             for f in self.findings], axis=1,
        )  # (N, K)  # fmt: skip
        truth = draw.test.targets
        methods = {"model": Prediction(change, change > CHANGE_MARGIN)}
        methods.update({reader: Prediction(decisions=truth.reader_labels[:, r, :].astype(bool))
                        for r, reader in enumerate(READERS)})  # fmt: skip
        scores = draw.test.table[["item_id"]].copy()
        for k, finding in enumerate(self.findings):
            scores[f"model_change_{finding.lower()}"] = change[:, k]
        return Outcome(methods, scores, ["model: zero-shot score on the current film minus the prior's"])

    def score(self, truth: Targets, prediction: Prediction) -> dict[str, float]:
        kappas = [cohen_kappa(truth.labels[:, k], prediction.decisions[:, k]) for k in range(len(self.findings))]
        out = {f"kappa_{f.lower()}": value for f, value in zip(self.findings, kappas, strict=True)}
        return {**out, "kappa_mean": float(np.nanmean(kappas)) if not np.isnan(kappas).all() else float("nan")}

    def extras(self, draw: Draw, outcome: Outcome, table: pd.DataFrame, n_boot: int) -> Extras:
        from matplotlib.figure import Figure  # a Figure without pyplot: no global state in tests

        truth = draw.test.targets
        rows = []
        for site in sorted(set(truth.groups)):
            index = np.flatnonzero(truth.groups == site)
            for method, prediction in outcome.methods.items():
                kappa = self.score(truth.take(index), prediction.take(index))["kappa_mean"] if prediction else np.nan
                rows.append({"site": site, "method": method, "n": len(index), "kappa_mean": kappa})
        by_site = pd.DataFrame(rows)
        means = table[table["metric"] == "kappa_mean"].set_index("protocol")["value"]
        figure = Figure(figsize=(3, 2))
        axes = figure.subplots()
        axes.bar(list(means.index), means.to_numpy())
        axes.set_ylabel("mean kappa")
        lines = ["## Mean kappa by site", "", "| site | method | items | mean kappa |", "|---|---|---|---|"]
        lines += [f"| {r.site} | {r.method} | {r.n} | {r.kappa_mean:.3f} |" for r in by_site.itertuples()]
        return Extras(
            tables={"kappa_by_site": by_site}, figures={"kappa_mean": figure}, sections=["\n".join(lines)],
            metrics={"readers/weakest_kappa_mean": float(means[list(READERS)].min()), "readers/undefined": np.nan},
            params={"sites": ", ".join(sorted(set(truth.groups)))},
        )  # fmt: skip


TOY_YAML = {
    "_target_": "tests.benchmark_data.ToyProgressionProtocol",
    "name": "toy",
    "description": "Toy reader study: did each finding worsen between two films?",
    "seed": 7,
    "versions": {"all": None, "first12": 12},
    "findings": list(FINDINGS),
    "prompts": {"Effusion": "a chest x-ray with a pleural effusion", "Edema": "a chest x-ray with pulmonary edema"},
    "bootstrap": "plain",
}


def write_toy_config(folder: Path) -> Path:
    """``<folder>/toy.yaml``, the toy protocol's config; returns the folder (a ``--config-dir``)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "toy.yaml").write_text(json.dumps(TOY_YAML, indent=1))  # JSON is YAML
    return folder
