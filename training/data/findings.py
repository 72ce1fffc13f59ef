"""The finding names the platform knows, in the challenge's spelling (docs/rules.md §1).

One place for them, so a manifest column can be checked against the full vocabulary and a typo is caught
instead of becoming a new, always-negative class.
"""

TASK1_LABELS: tuple[str, ...] = (
    "Alveolar Pattern", "Aortic Atheromatosis", "Aortic Elongation", "Atelectasis", "Azygos Lobe",
    "Bronchiectasis", "Cardiomegaly", "Calcified Densities", "Central Venous Catheter", "Emphysema", "Fracture",
    "Hemidiaphragm Elevation", "Hernia", "Hydropneumothorax", "Hyperinflated Lung", "Hypoexpansion",
    "Interstitial Pattern", "Kyphosis", "Mass", "Nodule", "Normal", "Pleural Effusion", "Pleural Thickening",
    "Pneumothorax", "Pneumoperitoneum", "Sternotomy", "Subcutaneous Emphysema", "Support Devices",
    "Vascular Hilar Enlargement", "Vertebral Degenerative Changes",
)  # fmt: skip

TASK2_LABELS: tuple[str, ...] = ("Adenopathy", "Bulla", "Goiter", "Infarction", "Osteopenia", "Scoliosis")

CXRLT_FINDINGS: tuple[str, ...] = TASK1_LABELS + TASK2_LABELS

NIH14_LABELS: tuple[str, ...] = (
    "Atelectasis", "Cardiomegaly", "Effusion", "Infiltration", "Mass", "Nodule", "Pneumonia", "Pneumothorax",
    "Consolidation", "Edema", "Emphysema", "Fibrosis", "Pleural_Thickening", "Hernia", "No Finding",
)  # fmt: skip

PEDIATRIC_LABELS: tuple[str, ...] = ("Pneumonia",)  # Kermany; the same finding as NIH's column

KNOWN_FINDINGS: tuple[str, ...] = tuple(dict.fromkeys(CXRLT_FINDINGS + NIH14_LABELS + PEDIATRIC_LABELS))
