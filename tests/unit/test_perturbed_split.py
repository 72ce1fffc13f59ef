"""One perturbed copy for every model: perturbed at the source resolution, built once, resized per model."""

from types import SimpleNamespace

import cv2
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import evaluation.perturbed_split as split_module
from evaluation.evaluate import _prefixed
from evaluation.intervals import left_out_note
from evaluation.perturb import PerturbCacheError, draw_params, perturb_image
from evaluation.perturbed_split import canonical, perturbed_split, predict_perturbed
from evaluation.suite import compute_suite
from training.data.dataset import ManifestDataset
from training.data.images import resize_pad, resize_stretch
from training.data.transforms import build_transform

SHAPES = [(60, 80), (90, 70), (50, 50), (72, 64), (40, 96)]  # mixed source resolutions, (H, W)


@pytest.fixture
def sources(tmp_path):
    """Smooth PNGs of mixed shapes (smooth, so resizing an image and perturbing it do not commute by accident)."""
    (tmp_path / "img").mkdir()
    paths = []
    for i, (height, width) in enumerate(SHAPES):
        y, x = np.mgrid[0:height, 0:width]
        image = (60 + 120 * np.exp(-(((x - width / 3) / 9) ** 2 + ((y - height / 2) / 7) ** 2)) + x + i).astype(
            np.uint8
        )
        cv2.imwrite(str(tmp_path / "img" / f"{i}.png"), image)
        paths.append(f"img/{i}.png")
    return tmp_path, paths


def split_at(root, paths, size: int, resize: str):
    """A model's test split at its own input size and resize mode, inside the bit of a data module used here."""
    targets = np.eye(len(paths), 3, dtype=np.float32)
    dataset = ManifestDataset(root, paths, targets, [f"id{i}" for i in range(len(paths))], size, build_transform(None),
                              threads=1, resize=resize)  # fmt: skip
    return SimpleNamespace(datasets={"test": dataset}, batch_size=2)


def settings(cache_dir, max_side=None):
    return OmegaConf.create({"seed": 7, "cache_dir": str(cache_dir), "max_side": max_side})


@pytest.fixture
def count_builds(monkeypatch):
    builds = []
    build = split_module._build
    monkeypatch.setattr(split_module, "_build", lambda *a, **k: builds.append(1) or build(*a, **k))
    return builds


def test_two_input_sizes_get_the_one_source_resolution_copy_resized(sources, tmp_path, count_builds):
    root, paths = sources
    small, large = split_at(root, paths, 32, "pad"), split_at(root, paths, 48, "stretch")
    cfg = settings(tmp_path / "cache")
    at_32, at_48 = perturbed_split(small, cfg), perturbed_split(large, cfg)
    assert len(count_builds) == 1  # the second model read the copy the first one built
    assert len(list((tmp_path / "cache").iterdir())) == 1
    stored = at_32.images
    assert np.array_equal(stored.pixels, at_48.images.pixels)
    params = draw_params(len(paths), 7)
    for i, path in enumerate(paths):
        source = cv2.imread(str(root / path), cv2.IMREAD_UNCHANGED)
        assert stored[i].shape == SHAPES[i]  # perturbed at the source's own size, not a model's
        assert np.array_equal(stored[i], perturb_image(source, params[i]))
        for model_split, resize, size in ((at_32, resize_pad, 32), (at_48, resize_stretch, 48)):
            item = model_split[i]
            assert item["image"].shape == (1, size, size)
            expected = model_split.dataset.transform(image=resize(np.ascontiguousarray(stored[i]), size))["image"]
            assert torch.equal(item["image"], expected)
            assert torch.equal(item["target"], model_split.dataset.targets[i])
    # Perturbing after the model's own resize (the old order) gives other pixels: the order is what is tested.
    after_resize = perturb_image(small.datasets["test"].image(0), params[0])
    assert not torch.equal(small.datasets["test"].model_input(after_resize), at_32[0]["image"])


def test_max_side_brings_large_sources_down_with_their_aspect(sources, tmp_path, count_builds):
    root, paths = sources
    model = split_at(root, paths, 32, "pad")
    capped = perturbed_split(model, settings(tmp_path / "cache", max_side=48))
    exact = perturbed_split(model, settings(tmp_path / "cache", max_side=None))
    assert len(count_builds) == 2  # the canonical side is part of the key
    params = draw_params(len(paths), 7)
    for i, (height, width) in enumerate(SHAPES):
        scale = min(1.0, 48 / max(height, width))
        assert capped.images[i].shape == (round(height * scale), round(width * scale))
        assert exact.images[i].shape == (height, width)
        reference = cv2.resize(cv2.imread(str(root / paths[i]), cv2.IMREAD_UNCHANGED),
                               (round(width * scale), round(height * scale)), interpolation=cv2.INTER_AREA)  # fmt: skip
        assert np.array_equal(capped.images[i], perturb_image(reference, params[i]))
    assert canonical(np.zeros((20, 10), np.uint8), 40).shape == (20, 10)  # never upsampled


def test_changed_source_file_is_refused_not_reused(sources, tmp_path):
    root, paths = sources
    model, cfg = split_at(root, paths, 32, "pad"), settings(tmp_path / "cache")
    perturbed_split(model, cfg)
    cv2.imwrite(str(root / paths[3]), np.full((72, 64), 9, np.uint8))
    with pytest.raises(PerturbCacheError, match="source file of image 'id3' changed"):
        perturbed_split(model, cfg)


def test_interrupted_build_leaves_no_copy(sources, tmp_path, monkeypatch):
    root, paths = sources
    calls = []

    def flaky(image, params):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return image

    monkeypatch.setattr(split_module, "perturb_image", flaky)
    with pytest.raises(KeyboardInterrupt):
        perturbed_split(split_at(root, paths, 32, "pad"), settings(tmp_path / "cache"))
    assert list((tmp_path / "cache").iterdir()) == []


def test_predictions_are_the_models_outputs_on_the_resized_copy_in_order(sources, tmp_path):
    root, paths = sources
    model_split = split_at(root, paths, 32, "pad")
    cfg = settings(tmp_path / "cache")
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(32 * 32, 3))
    probs = predict_perturbed(model, model_split, cfg)
    copy = perturbed_split(model_split, cfg)
    with torch.no_grad():
        expected = torch.sigmoid(model(torch.stack([copy[i]["image"] for i in range(len(paths))]))).numpy()
    np.testing.assert_allclose(probs, expected, rtol=1e-5, atol=1e-6)


def test_a_macros_only_set_logs_the_counts_behind_its_left_out_note():
    """``make card``'s ``test_perturbed/mAP`` row reads the note from the run's flat metrics, like ``test/mAP``."""
    targets = np.zeros((30, 5), int)
    targets[:10, 0], targets[5:20, 1], targets[3, 2] = 1, 1, 1  # classes 3 and 4: no positive
    probs = np.random.default_rng(0).random((30, 5))
    result = compute_suite(targets, probs, list("abcde"), n_boot=50, seed=1)
    logged = _prefixed("test_perturbed", result.metrics, macros_only=True)
    assert not any(key.startswith("test_perturbed/ap/") for key in logged)  # no per-class values for this set
    assert logged["test_perturbed/mAP_classes_left_out"] == 2 and logged["test_perturbed/mAP_classes_scored"] == 3
    as_stored = {key: float(value) for key, value in logged.items()}  # MLflow hands every metric back as a float
    for metrics in (logged, as_stored):
        note = left_out_note(metrics, "test_perturbed", 50)
        assert note.startswith("2 of 5 classes have no positive in test_perturbed and are left out of its macro means")
