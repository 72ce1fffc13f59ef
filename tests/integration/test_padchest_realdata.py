"""The ``padchest`` adapter on PadChest's released table (../shared/data/padchest-labels, all 160,861 rows): its
per-class counts against a plain text count of the same table written here, independently of the adapter's
parsing and roll-up (quoted names matched in the raw ``Labels`` text)."""

from __future__ import annotations

import re
import time

import pandas as pd
import pytest

from tests.conftest import shared_data
from training.data.adapters.padchest import PadChestSource

pytestmark = pytest.mark.realdata

# Class -> PadChest names, written out by hand (docs/data.md, "PadChest's own table").
CHILDREN = {
    "Normal": ["normal"],
    "Cardiomegaly": ["cardiomegaly"],
    "Scoliosis": ["scoliosis"],
    "Goiter": ["goiter"],
    "Bulla": ["bullas"],
    "Pneumoperitoneum": ["pneumoperitoneo"],
    "Hernia": ["hiatal hernia"],
    "Hydropneumothorax": ["hydropneumothorax"],
    "Nodule": ["nodule", "multiple nodules"],
    "Fracture": [
        "fracture",
        "rib fracture",
        "callus rib fracture",
        "clavicle fracture",
        "humeral fracture",
        "vertebral fracture",
    ],  # fmt: skip
    "Central Venous Catheter": [
        "central venous catheter",
        "central venous catheter via jugular vein",
        "central venous catheter via subclavian vein",
        "central venous catheter via umbilical vein",
        "reservoir central venous catheter",
    ],
    "Pleural Effusion": [
        "pleural effusion",
        "loculated pleural effusion",
        "loculated fissural effusion",
        "empyema",
        "hydropneumothorax",
    ],  # fmt: skip
    "Atelectasis": [
        "atelectasis",
        "laminar atelectasis",
        "lobar atelectasis",
        "segmental atelectasis",
        "total atelectasis",
        "round atelectasis",
        "atelectasis basal",
    ],  # fmt: skip
    "Aortic Elongation": [
        "aortic elongation",
        "descendent aortic elongation",
        "ascendent aortic elongation",
        "supra aortic elongation",
        "aortic button enlargement",
    ],  # fmt: skip
    "Mass": ["mass", "pulmonary mass", "mediastinal mass", "pleural mass", "breast mass", "soft tissue mass"],
}


def names_in(labels: pd.Series, names: list[str]) -> pd.Series:
    """Rows whose raw ``Labels`` text holds one of ``names`` as a whole quoted item (a leading space allowed)."""
    return labels.str.contains("'\\s*(?:" + "|".join(map(re.escape, names)) + ")'", regex=True)


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    root = shared_data("padchest-labels")
    source = PadChestSource(str(root), out_dir=str(tmp_path_factory.mktemp("padchest") / "m"))
    started = time.perf_counter()
    manifest = pd.read_csv(source.prepare(), dtype=str, keep_default_na=False)
    seconds = time.perf_counter() - started
    raw = pd.read_csv(next(root.glob("PADCHEST_*.csv*")), dtype=str, keep_default_na=False,
                      usecols=["ImageID", "PatientID", "Projection", "Labels"])  # fmt: skip
    return source, manifest, raw, seconds


def test_per_class_counts_match_a_plain_count_of_the_table(release):
    source, manifest, raw, seconds = release
    kept = (raw["Labels"] != "nan") & (raw["Labels"] != "['']") & raw["Projection"].isin(["PA", "L", "AP",
            "AP_horizontal"]) & ~names_in(raw["Labels"], ["exclude"])  # fmt: skip
    assert int(kept.sum()) == len(manifest) == 158_040
    expected = {label: int((kept & names_in(raw["Labels"], names)).sum()) for label, names in CHILDREN.items()}
    found = {label: int((manifest[label] == "1").sum()) for label in CHILDREN}
    assert found == expected
    assert expected["Normal"] == 50_395 and expected["Fracture"] == 4_453  # docs/data.md quotes these
    assert (manifest["Infarction"] == "").all()
    assert seconds < 120, f"the adapter took {seconds:.0f} s on 160k rows"


def test_the_103_unparsed_rows_are_reported_and_nothing_else_disappears(release):
    source, manifest, raw, _ = release
    summary = source.summary
    assert (raw["Labels"] == "nan").sum() == 103 == summary.kept_out["Labels does not parse"]
    assert summary.rows == len(raw) and summary.rows - sum(summary.kept_out.values()) == len(manifest)
    listing = pd.read_csv(summary.listing_path, dtype=str, keep_default_na=False)
    unparsed = listing[listing["reason"].str.startswith("Labels does not parse")]
    assert set(unparsed["ImageID"]) == set(raw.loc[raw["Labels"] == "nan", "ImageID"])
    assert (manifest.groupby("patient_id")["split"].nunique() == 1).all()
