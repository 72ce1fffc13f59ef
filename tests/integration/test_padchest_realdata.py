"""The ``padchest`` adapter on PadChest's released table (../shared/data/padchest-labels, all 160,861 rows): its
per-class counts against a plain text count of the same table written here, independently of the adapter's
parsing and roll-up (quoted names matched in the raw ``Labels`` text). With the defaults every row is an image of
the manifest, as in the organisers' training table; the classes listed are those whose children the organisers
read differently from PadChest's hierarchy, and a few plain ones."""

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
    "Nodule": [
        "nodule",
        "multiple nodules",
        "granuloma",
        "calcified granuloma",
        "pseudonodule",
        "nipple shadow",
        "end on vessel",
    ],  # fmt: skip
    "Calcified Densities": ["calcified densities", "calcified adenopathy", "calcified mediastinal adenopathy"],
    "Support Devices": [
        "NSG tube",
        "endotracheal tube",
        "tracheostomy tube",
        "ventriculoperitoneal drain tube",
        "gastrostomy tube",
        "nephrostomy tube",
        "double J stent",
        "electrical device",
        "pacemaker",
        "dual chamber device",
        "single chamber device",
        "dai",
    ],
    "Hyperinflated Lung": ["hyperinflated lung", "air trapping", "flattened diaphragm"],
    "Hypoexpansion": ["hypoexpansion", "hypoexpansion basal", "volume loss"],
    "Vascular Hilar Enlargement": ["vascular hilar enlargement", "hilar congestion", "pulmonary artery enlargement"],
    "Alveolar Pattern": ["alveolar pattern", "consolidation", "air bronchogram", "cavitation"],
    "Pleural Thickening": ["pleural thickening", "apical pleural thickening", "calcified pleural thickening"],
    "Cardiomegaly": ["cardiomegaly"],
    "Scoliosis": ["scoliosis"],
    "Goiter": ["goiter"],
    "Bulla": ["bullas"],
    "Pneumoperitoneum": ["pneumoperitoneo"],
    "Hernia": ["hiatal hernia"],
    "Hydropneumothorax": ["hydropneumothorax"],
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
        "costophrenic angle blunting",
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
    "Mass": ["mass", "mediastinal mass", "pleural mass", "breast mass", "soft tissue mass"],
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
    assert len(raw) == len(manifest) == 160_861  # every image, as in the organisers' table
    assert manifest["image_id"].tolist() == raw["ImageID"].str.strip().tolist()
    expected = {label: int(names_in(raw["Labels"], names).sum()) for label, names in CHILDREN.items()}
    found = {label: int((manifest[label] == "1").sum()) for label in CHILDREN}
    assert found == expected
    assert expected["Normal"] == 50_616  # every row naming `normal`, ../shared/data/README.md's count
    assert {k: expected[k] for k in ("Fracture", "Nodule", "Support Devices", "Pleural Effusion")} == {
        "Fracture": 4_631, "Nodule": 10_392, "Support Devices": 10_671, "Pleural Effusion": 15_692,
    }  # docs/data.md quotes these  # fmt: skip
    assert (manifest["Infarction"] == "").all()
    assert manifest["view"].value_counts(dropna=False).to_dict() == {"PA": 91_728, "LATERAL": 49_579,
        "AP Supine": 14_346, "AP": 4_559, "COSTAL": 630, "": 19}  # fmt: skip
    assert seconds < 120, f"the adapter took {seconds:.0f} s on 160k rows"


def test_the_880_unlabelled_rows_are_all_zero_rows_reported_and_nothing_disappears(release):
    source, manifest, raw, _ = release
    summary = source.summary
    assert (raw["Labels"] == "nan").sum() == 103 and (raw["Labels"] == "['']").sum() == 777
    assert summary.unlabelled == {"Labels does not parse": 103, "no label name": 777}
    assert summary.rows == len(raw) == len(manifest) and summary.kept_out == {}
    listing = pd.read_csv(summary.listing_path, dtype=str, keep_default_na=False)
    unlabelled = listing[listing["reason"].str.contains("unlabelled, all-zero row")]
    empty = raw["Labels"].isin(["nan", "['']"])
    assert set(unlabelled["ImageID"]) == set(raw.loc[empty, "ImageID"])
    labels = [c for c in manifest.columns[-36:] if c != "Infarction"]
    assert (manifest.loc[empty.to_numpy(), labels] == "0").all().all()
    assert (manifest.groupby("patient_id")["split"].nunique() == 1).all()
