"""The source heterogeneity report on images whose statistics are known by construction."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import cv2
import numpy as np
import pandas as pd
import pytest
from PIL import Image

from training.data.audit import check_dataset
from training.data.heterogeneity import measure, view_group


@pytest.fixture
def two_sources(tmp_path):
    """Source ``a``: 16-bit PNGs, constant 32768, 300 x 200 and 100 x 400. Source ``b``: 8-bit PNGs 64 x 32, left
    half black and right half white, plus one RGB PNG 64 x 32 of the same halves (luminance 0 and 255)."""
    (tmp_path / "img").mkdir()
    for name, (w, h) in {"a0": (300, 200), "a1": (100, 400)}.items():
        cv2.imwrite(str(tmp_path / "img" / f"{name}.png"), np.full((h, w), 32768, np.uint16))
    halves = np.zeros((32, 64), np.uint8)
    halves[:, 32:] = 255
    for name in ("b0", "b1", "b2"):
        cv2.imwrite(str(tmp_path / "img" / f"{name}.png"), halves)
    Image.fromarray(np.stack([halves] * 3, axis=2), "RGB").save(tmp_path / "img" / "b3.png")
    table = pd.DataFrame({
        "image_id": ["a0", "a1", "b0", "b1", "b2", "b3"],
        "path": [f"img/{n}.png" for n in ("a0", "a1", "b0", "b1", "b2", "b3")],
        "split": ["train", "val", "train", "train", "val", "test"],
        "patient_id": ["p0", "p1", "p2", "p3", "p4", "p5"],
        "source": ["a", "a", "b", "b", "b", "b"],
        "view": ["PA", "AP Supine", "AP", "", "L", "PA"],
        "Cardiomegaly": ["1", "1", "0", "1", "", "0"],
        "Effusion": ["0", "0", "1", "1", "1", "0"],
    })  # fmt: skip
    table.to_csv(tmp_path / "manifest.csv", index=False)
    return tmp_path, table


def by_source(report):
    return {s.source: s for s in report.sources}


def test_known_images_give_known_figures(two_sources):
    root, table = two_sources
    stats = by_source(measure(table, root, ["Cardiomegaly", "Effusion"]))
    a, b = stats["a"], stats["b"]
    assert (a.images, a.sampled, b.images, b.sampled) == (2, 2, 4, 4)
    assert a.mean == pytest.approx(32768 / 65535) and a.sd == pytest.approx(0.0, abs=1e-6)
    assert b.mean == pytest.approx(0.5) and b.sd == pytest.approx(0.5)
    assert (a.width, a.height) == (200.0, 300.0)
    assert a.megapixels == pytest.approx((300 * 200 + 100 * 400) / 2 / 1e6)
    assert (b.width, b.height, b.megapixels) == (64.0, 32.0, pytest.approx(64 * 32 / 1e6))
    assert a.views == {"PA": 0.5, "AP": 0.5, "lateral": 0.0, "other": 0.0, "unknown": 0.0}
    assert b.views == {"PA": 0.25, "AP": 0.25, "lateral": 0.25, "other": 0.0, "unknown": 0.25}
    assert a.labels == {"Cardiomegaly": 1.0, "Effusion": 0.0}
    assert b.labels == {"Cardiomegaly": 0.25, "Effusion": 0.75}  # the unlabelled cell is not a positive


def test_pooled_sd_weighs_every_pixel_and_holds_the_spread_between_images(tmp_path):
    """A black and a white 8-bit image, each constant: every per-image SD is 0, the pooled SD 0.5."""
    for name, value, size in (("black", 0, (10, 10)), ("white", 255, (10, 30))):
        cv2.imwrite(str(tmp_path / f"{name}.png"), np.full(size, value, np.uint8))
    table = pd.DataFrame({"path": ["black.png", "white.png"]})
    (stats,) = measure(table, tmp_path).sources
    assert stats.source == "all"  # no source column: one group
    assert stats.mean == pytest.approx(0.75)  # 300 white pixels of 400
    assert stats.sd == pytest.approx(np.sqrt(0.75 * 0.25))


def test_dicom_size_from_its_header_and_intensities_by_its_stored_range(tmp_path):
    """A 12-bit DICOM without a window (half 0, half 4095: mean 0.5, SD 0.5 on its stored range, not 65535) and
    one with a window, 8-bit display values constant 51 (0.2)."""
    from tests.dicom_files import write_dicom, write_display_dicom

    halves = np.zeros((20, 40), np.uint16)
    halves[:, 20:] = 4095
    write_dicom(tmp_path / "raw.dcm", halves)
    write_display_dicom(tmp_path / "shown.dcm", np.full((20, 40), 51, np.uint8))
    table = pd.DataFrame({"path": ["raw.dcm", "shown.dcm"], "source": ["raw", "shown"]})
    raw, shown = measure(table, tmp_path).sources
    assert (raw.width, raw.height, raw.unreadable) == (40.0, 20.0, 0)
    assert raw.mean == pytest.approx(0.5) and raw.sd == pytest.approx(0.5)
    assert shown.mean == pytest.approx(0.2) and shown.sd == pytest.approx(0.0, abs=1e-6)


def test_the_sample_is_capped_seeded_and_stated(two_sources):
    root, table = two_sources
    first = measure(table, root, sample=2, seed=3)
    again = measure(table, root, sample=2, seed=3)
    b = by_source(first)["b"]
    assert b.sampled == 2 and b.images == 4 and b.sized == 4  # resolution still from every header
    assert first.to_json() == again.to_json()
    assert "at most 2 image(s) per source" in first.render()
    only_sample = by_source(measure(table, root, sample=1, seed=0, resolution_from="sample"))["a"]
    assert only_sample.sized == 1 and (only_sample.width, only_sample.height) in {(300.0, 200.0), (100.0, 400.0)}
    with pytest.raises(ValueError, match="resolution_from='headers'"):
        measure(table, root, resolution_from="headers")


def test_unreadable_files_are_counted_and_left_out(two_sources):
    root, table = two_sources
    (root / "img" / "b0.png").write_bytes(b"not an image")
    b = by_source(measure(table, root))["b"]
    assert (b.unreadable, b.sampled, b.sized) == (1, 3, 3)
    assert b.mean == pytest.approx(0.5) and b.width == 64.0


@pytest.mark.parametrize(
    ("value", "group"),
    [("PA", "PA"), ("pa", "PA"), ("AP", "AP"), ("AP Supine", "AP"), ("AP_horizontal", "AP"), ("L", "lateral"),
     ("LL", "lateral"), ("XTABLE LATERAL", "lateral"), ("", "unknown"), ("nan", "unknown"), ("LAO", "other")],
)  # fmt: skip
def test_view_spellings_fold_into_five_groups(value, group):
    assert view_group(value) == group


def test_json_and_text_carry_the_figures(two_sources):
    root, table = two_sources
    report = measure(table, root, ["Cardiomegaly", "Effusion"])
    data = json.loads(report.to_json())
    assert [s["source"] for s in data["sources"]] == ["a", "b"] and data["sample"] == 500
    assert data["sources"][1]["labels"]["Effusion"] == 0.75
    summary = report.summary()
    assert summary.loc["b", "AP %"] == 25.0 and summary.loc["a", "width x height"] == "200.0 x 300.0"
    assert summary.loc["b", "top labels (% of images)"] == "Effusion 75.0, Cardiomegaly 25.0"
    assert report.label_table().loc["Effusion", "b"] == 75.0
    assert report.markdown().startswith("# Source heterogeneity")


def test_data_check_prints_the_section(two_sources):
    root, _ = two_sources
    report = check_dataset(root / "manifest.csv", root, heterogeneity={"sample": 3})
    section = report.sections["source heterogeneity"]
    assert "at most 3 image(s)" in section
    rows = {line.split()[0]: line.split()[1:] for line in section.split("\n\n")[0].splitlines()}
    assert rows["source"] == ["a", "b"] and rows["images"] == ["2", "4"] and rows["measured"] == ["2", "3"]
    assert rows["AP"] == ["%", "50.0", "25.0"] and rows["mean"] == ["0.5", "0.5"]
    assert "  b: Effusion 75.0, Cardiomegaly 25.0" in section


def test_a_new_run_keeps_the_report_as_artifacts(two_sources, tmp_path):
    from omegaconf import OmegaConf

    from training.tracking.run_context import record_context
    from training.tracking.uri import tracking_client

    root, table = two_sources
    manifest = SimpleNamespace(table=table, root=root, labels=("Effusion",), fingerprint="ab12",
                               source_file=root / "manifest.csv")  # fmt: skip
    datamodule = SimpleNamespace(manifest=manifest, source=SimpleNamespace(name="fixture"),
                                 split_frame=lambda split: table[table["split"] == split])  # fmt: skip
    cfg = OmegaConf.create({"task": {"name": "task1"}, "model": {"name": "m"}, "loss": {"name": "bce"},
                            "sampler": {"name": "random"}, "seed": 0, "checkpoint": {"monitor": "val/mAP",
                            "mode": "max"}, "heterogeneity": {"sample": 1}})  # fmt: skip
    client = tracking_client(f"sqlite:///{tmp_path}/mlflow.db")
    run_id = client.create_run(client.create_experiment("task1", artifact_location=str(tmp_path / "art"))).info.run_id
    record_context(client, run_id, cfg, datamodule)
    data = json.loads(Path(client.download_artifacts(run_id, "data/heterogeneity.json", str(tmp_path))).read_text())
    assert data["sample"] == 1 and [s["sampled"] for s in data["sources"]] == [1, 1]
    assert [s["labels"] for s in data["sources"]] == [{"Effusion": 0.0}, {"Effusion": 0.75}]
    text = Path(client.download_artifacts(run_id, "data/heterogeneity.md", str(tmp_path))).read_text()
    assert "at most 1 image(s) per source" in text
