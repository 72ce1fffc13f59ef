"""Text side of Task 2: template ensembling, bank coverage, class-embedding cache, the lexical encoder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.conftest import PROJECT_ROOT
from training.data.findings import KNOWN_FINDINGS, TASK2_LABELS
from training.zeroshot.bank import DescriptionBank, MissingDescriptionError
from training.zeroshot.embeddings import cached_class_embeddings, class_embeddings, ensemble
from training.zeroshot.text_encoders import HashingEncoder


class CountingEncoder:
    """Deterministic fake encoder: text -> seeded random unit vector; counts calls and texts."""

    def __init__(self, key: str | None = "fake:v1", dim: int = 8):
        self.key, self.dim, self.calls, self.texts = key, dim, 0, []

    @property
    def cache_key(self):
        return self.key

    def encode(self, texts):
        self.calls += 1
        self.texts.extend(texts)
        rows = [np.random.default_rng(abs(hash(t)) % 2**32).normal(size=self.dim) for t in texts]
        return np.stack(rows).astype(np.float32)  # deliberately NOT normalised: ensemble must normalise


def test_ensemble_normalises_each_text_then_the_mean():
    texts = np.array([[3.0, 0.0], [0.0, 1.0]])  # norms 3 and 1
    out = ensemble(texts)
    np.testing.assert_allclose(out, [np.sqrt(0.5), np.sqrt(0.5)], atol=1e-6)  # mean of unit vectors, re-normalised
    naive = texts.mean(axis=0) / np.linalg.norm(texts.mean(axis=0))
    assert not np.allclose(out, naive, atol=1e-3)  # a plain mean would favour the long vector
    assert np.linalg.norm(out) == pytest.approx(1.0, abs=1e-6)


def test_class_embedding_averages_templates_times_phrasings_plus_description():
    bank = DescriptionBank.load()
    encoder = CountingEncoder()
    (emb,) = class_embeddings(["Scoliosis"], bank, encoder.encode)
    entry = bank.classes["Scoliosis"]
    expected_texts = [t.format(p) for t in bank.templates["positive"] for p in entry.phrasings] + [entry.description]
    assert encoder.texts == expected_texts and encoder.calls == 1
    raw = encoder.encode(expected_texts)
    unit = raw / np.linalg.norm(raw, axis=1, keepdims=True)
    hand = unit.mean(axis=0) / np.linalg.norm(unit.mean(axis=0))
    np.testing.assert_allclose(emb, hand, atol=1e-6)
    negative = bank.flat_prompts(["Scoliosis"], "negative")[0]
    assert len(negative) == len(bank.templates["negative"]) * len(entry.phrasings)
    assert all("no " in t or "without" in t or "not " in t for t in negative)


def _task_labels() -> dict[str, list[str]]:
    out = {}
    for path in sorted((PROJECT_ROOT / "configs" / "task").glob("*.yaml")):
        cfg = yaml.safe_load(path.read_text())
        if cfg.get("labels") is None:  # labels from the data (rocov2_concepts: UMLS CUIs), not findings to describe
            continue
        out[path.stem] = list(cfg.get("labels") or []) + list(cfg.get("unseen") or [])
    return out


def test_bank_covers_every_label_of_every_task_config_and_every_known_finding():
    bank = DescriptionBank.load()
    tasks = _task_labels()
    assert {"task1", "task2", "nih14", "pneumonia"} <= set(tasks)
    for task, labels in tasks.items():
        assert labels, task
        assert bank.missing(labels) == [], f"configs/task/{task}.yaml labels without a description"
    assert bank.missing(KNOWN_FINDINGS) == []
    assert set(TASK2_LABELS) <= set(tasks["task2"])
    for name in KNOWN_FINDINGS:
        entry = bank.classes[name]
        assert len(entry.phrasings) >= 3 and len(entry.description) > 40, name


def test_a_missing_description_fails_naming_the_class(tmp_path):
    raw = yaml.safe_load((PROJECT_ROOT / "configs" / "text" / "descriptions.yaml").read_text())
    del raw["classes"]["Goiter"]
    path = tmp_path / "bank.yaml"
    path.write_text(yaml.safe_dump(raw))
    bank = DescriptionBank.load(path)
    assert bank.missing(_task_labels()["task2"]) == ["Goiter"]
    with pytest.raises(MissingDescriptionError, match="Goiter"):
        bank.require(["Bulla", "Goiter"])


def test_bank_rejects_a_template_without_a_slot(tmp_path):
    raw = yaml.safe_load((PROJECT_ROOT / "configs" / "text" / "descriptions.yaml").read_text())
    raw["templates"]["negative"].append("no finding here")
    path = tmp_path / "bank.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ValueError, match="no finding here"):
        DescriptionBank.load(path)


def test_class_embeddings_are_cached_and_reused(tmp_path):
    bank = DescriptionBank.load()
    names = list(TASK2_LABELS)
    encoder = CountingEncoder()
    first = cached_class_embeddings(names, bank, encoder, cache_dir=tmp_path)
    assert encoder.calls == 1 and len(list(tmp_path.glob("*.npy"))) == 1
    second = cached_class_embeddings(names, bank, encoder, cache_dir=tmp_path)
    assert encoder.calls == 1  # read from disk, the encoder untouched
    np.testing.assert_array_equal(first, second)
    assert first.shape == (6, 8) and np.allclose(np.linalg.norm(first, axis=1), 1.0, atol=1e-6)
    # Another encoder, another prompt side or another bank content: recomputed, never a stale hit.
    other = CountingEncoder(key="fake:v2")
    cached_class_embeddings(names, bank, other, cache_dir=tmp_path)
    cached_class_embeddings(names, bank, encoder, kind="negative", cache_dir=tmp_path)
    assert other.calls == 1 and encoder.calls == 2
    raw = yaml.safe_load(bank.path.read_text())
    raw["classes"]["Bulla"]["description"] += " Edited."
    edited_path = tmp_path / "edited.yaml"
    edited_path.write_text(yaml.safe_dump(raw))
    edited = DescriptionBank.load(edited_path)
    assert edited.content_hash != bank.content_hash
    cached_class_embeddings(names, edited, encoder, cache_dir=tmp_path)
    assert encoder.calls == 3 and len(list(tmp_path.glob("*.npy"))) == 4


def test_an_encoder_without_identity_is_never_cached(tmp_path):
    encoder = CountingEncoder(key=None)  # e.g. a randomly initialised CLIP text tower
    cached_class_embeddings(["Bulla"], DescriptionBank.load(), encoder, cache_dir=tmp_path)
    cached_class_embeddings(["Bulla"], DescriptionBank.load(), encoder, cache_dir=tmp_path)
    assert encoder.calls == 2 and not list(Path(tmp_path).iterdir())


def test_hashing_encoder_is_deterministic_unit_norm_and_lexical():
    encoder = HashingEncoder(dim=128)
    a = encoder.encode(["subcutaneous emphysema", "emphysema", "cardiomegaly"])
    b = HashingEncoder(dim=128).encode(["subcutaneous emphysema", "emphysema", "cardiomegaly"])
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-6)
    assert a[0] @ a[1] > a[1] @ a[2] + 0.2  # shared word -> closer


def test_text_embeddings_pick_classes_from_the_whole_bank_and_centre_on_request(tmp_path):
    from training.zeroshot.text_side import text_embeddings

    cfg = {"text_encoder": {"_target_": "training.zeroshot.text_encoders.HashingEncoder", "dim": 64},
           "cache_dir": str(tmp_path)}  # fmt: skip
    bank = DescriptionBank.load()
    every = cached_class_embeddings(list(bank.classes), bank, HashingEncoder(64), cache_dir=None)
    names = ["Scoliosis", "Kyphosis", "Normal"]
    rows = [list(bank.classes).index(n) for n in names]
    np.testing.assert_allclose(text_embeddings(cfg, names), every[rows], atol=1e-6)
    centred = every - every.mean(axis=0)
    centred /= np.linalg.norm(centred, axis=1, keepdims=True)
    out = text_embeddings({**cfg, "center": True}, names)
    np.testing.assert_allclose(out, centred[rows], atol=1e-6)
    # The reference is the whole bank, not the classes asked for: the same row whatever the task's split.
    np.testing.assert_allclose(text_embeddings({**cfg, "center": True}, ["Scoliosis"])[0], out[0], atol=1e-6)
    with pytest.raises(MissingDescriptionError, match="Not A Finding"):
        text_embeddings(cfg, ["Scoliosis", "Not A Finding"])
