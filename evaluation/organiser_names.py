"""The CXR-LT 2026 organisers' class columns, spelt and ordered exactly as their release ships them.

The overview paper writes findings in title case ("Pleural Effusion"); the organisers' files do not follow it, nor
one rule of their own: ``CXRLT_2026_training.csv`` mixes PadChest's lower case ("aortic elongation"), title case
("Support Devices") and Spanish ("pneumoperitoneo"), and ``Eval_Class_Task2.txt`` writes "goiter" beside
"Scoliosis" (docs/data.md, "The CXR-LT 2026 release"). This table is the one mapping between the two spellings:
the adapter reads the training table through it, ``make submit`` writes its header from it, ``make score`` reads
a file spelt either way through it. It lives in the bottom layer because prediction files are read here.
"""

from __future__ import annotations

#: Paper name -> the organisers' column, in the order of the training table's header (Task 1's 30 classes).
TASK1_COLUMNS: dict[str, str] = {
    "Normal": "Normal", "Aortic Elongation": "aortic elongation", "Cardiomegaly": "cardiomegaly",
    "Pleural Effusion": "pleural effusion", "Nodule": "Nodule", "Atelectasis": "atelectasis",
    "Pleural Thickening": "pleural thickening", "Aortic Atheromatosis": "aortic atheromatosis",
    "Support Devices": "Support Devices", "Alveolar Pattern": "alveolar pattern", "Fracture": "fracture",
    "Hernia": "Hernia", "Emphysema": "Emphysema", "Azygos Lobe": "azygos lobe", "Hydropneumothorax": "Hydropneumothorax",
    "Kyphosis": "Kyphosis", "Mass": "Mass", "Pneumothorax": "Pneumothorax",
    "Subcutaneous Emphysema": "Subcutaneous Emphysema", "Pneumoperitoneum": "pneumoperitoneo",
    "Vascular Hilar Enlargement": "vascular hilar enlargement",
    "Vertebral Degenerative Changes": "vertebral degenerative changes", "Hyperinflated Lung": "hyperinflated lung",
    "Interstitial Pattern": "interstitial pattern", "Central Venous Catheter": "central venous catheter",
    "Hypoexpansion": "hypoexpansion", "Bronchiectasis": "bronchiectasis",
    "Hemidiaphragm Elevation": "hemidiaphragm elevation", "Sternotomy": "sternotomy",
    "Calcified Densities": "calcified densities",
}  # fmt: skip

#: Paper name -> the organisers' column, in the order of ``Eval_Class_Task2.txt`` (Task 2's six classes).
TASK2_COLUMNS: dict[str, str] = {
    "Scoliosis": "Scoliosis", "Osteopenia": "Osteopenia", "Bulla": "Bulla", "Infarction": "Infarction",
    "Adenopathy": "Adenopathy", "Goiter": "goiter",
}  # fmt: skip

#: Paper name -> organisers' column, both tasks.
ORGANISER_SPELLING: dict[str, str] = {**TASK1_COLUMNS, **TASK2_COLUMNS}


def organiser_order(labels) -> list[str]:
    """``labels`` (paper names) in the organisers' order for their task, each spelt their way.

    A label set that is exactly one task's classes comes back as that task's columns in the release's order (the
    submission's header); any other set keeps its own order, each name spelt the organisers' way where they have
    one.
    """
    labels = list(labels)
    for columns in (TASK1_COLUMNS, TASK2_COLUMNS):
        if set(labels) == set(columns):
            return list(columns.values())
    return [ORGANISER_SPELLING.get(name, name) for name in labels]
