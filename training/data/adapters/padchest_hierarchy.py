"""PadChest's label names rolled up to the CXR-LT 2026 classes: the one table the ``padchest`` adapter reads.

A PadChest report names the most specific term of a hierarchy, and the CXR-LT 2026 classes are parents, so a class
is the union of its children; a name may feed two classes (hydropneumothorax). Where the organisers' rows show
how they read a name, this table follows them (entries marked "organisers"), since a model is scored against
their reading; elsewhere PadChest's hierarchy holds. Every released name is listed, ``()`` meaning deliberately
unmapped, so a later release's new term is an error to decide here, never dropped by default. docs/data.md
("PadChest's own table") renders this table; a unit test keeps the two equal.
"""

from __future__ import annotations

from collections.abc import Iterable

#: PadChest name -> the CXR-LT 2026 classes it is a child of (``()``: deliberately not mapped).
ROLLUP: dict[str, tuple[str, ...]] = {
    # --- Normal is a label of its own: only the name `normal`, never the absence of findings.
    "normal": ("Normal",),
    # --- parenchyma
    "alveolar pattern": ("Alveolar Pattern",),
    "consolidation": ("Alveolar Pattern",),  # nested under alveolar pattern in PadChest's tree
    "air bronchogram": ("Alveolar Pattern",),  # a child of consolidation
    "cavitation": ("Alveolar Pattern",),  # organisers
    "interstitial pattern": ("Interstitial Pattern",),
    "reticular interstitial pattern": ("Interstitial Pattern",),
    "reticulonodular interstitial pattern": ("Interstitial Pattern",),
    "ground glass pattern": ("Interstitial Pattern",),
    "miliary opacities": ("Interstitial Pattern",),
    "atelectasis": ("Atelectasis",),
    "laminar atelectasis": ("Atelectasis",),
    "lobar atelectasis": ("Atelectasis",),
    "segmental atelectasis": ("Atelectasis",),
    "total atelectasis": ("Atelectasis",),
    "round atelectasis": ("Atelectasis",),
    "atelectasis basal": ("Atelectasis",),
    "azygos lobe": ("Azygos Lobe",),
    "bronchiectasis": ("Bronchiectasis",),
    "emphysema": ("Emphysema",),
    "bullas": ("Bulla",),
    "hyperinflated lung": ("Hyperinflated Lung",),
    "air trapping": ("Hyperinflated Lung",),  # organisers
    "flattened diaphragm": ("Hyperinflated Lung",),  # organisers
    "hypoexpansion": ("Hypoexpansion",),
    "hypoexpansion basal": ("Hypoexpansion",),
    "volume loss": ("Hypoexpansion",),  # organisers
    "nodule": ("Nodule",),
    "multiple nodules": ("Nodule",),
    "granuloma": ("Nodule",),  # organisers
    "calcified granuloma": ("Nodule",),  # organisers: a nodule, not a calcified density
    "pseudonodule": ("Nodule",),  # organisers, with its children: nipple shadows and end-on vessels
    "nipple shadow": ("Nodule",),  # organisers
    "end on vessel": ("Nodule",),  # organisers
    "mass": ("Mass",),
    "mediastinal mass": ("Mass",),
    "pleural mass": ("Mass",),
    "breast mass": ("Mass",),
    "soft tissue mass": ("Mass",),
    # --- calcifications: the organisers' Calcified Densities is the name itself (their calcified granuloma is a
    # Nodule, calcified pleural thickening a Pleural Thickening, a calcified valve or fibroadenoma neither)
    "calcified densities": ("Calcified Densities",),
    "calcified adenopathy": ("Calcified Densities", "Adenopathy"),
    "calcified mediastinal adenopathy": ("Calcified Densities", "Adenopathy"),
    # --- pleura
    "pleural effusion": ("Pleural Effusion",),
    "loculated pleural effusion": ("Pleural Effusion",),
    "loculated fissural effusion": ("Pleural Effusion",),
    "empyema": ("Pleural Effusion",),
    "costophrenic angle blunting": ("Pleural Effusion",),  # organisers
    "hydropneumothorax": ("Hydropneumothorax", "Pleural Effusion", "Pneumothorax"),
    "pneumothorax": ("Pneumothorax",),
    "pleural thickening": ("Pleural Thickening",),
    "apical pleural thickening": ("Pleural Thickening",),
    "calcified pleural thickening": ("Pleural Thickening",),  # organisers: not a Calcified Density
    # --- mediastinum, hila, heart, aorta
    "cardiomegaly": ("Cardiomegaly",),
    "aortic atheromatosis": ("Aortic Atheromatosis",),
    "aortic elongation": ("Aortic Elongation",),
    "descendent aortic elongation": ("Aortic Elongation",),
    "ascendent aortic elongation": ("Aortic Elongation",),
    "supra aortic elongation": ("Aortic Elongation",),
    "aortic button enlargement": ("Aortic Elongation",),
    "vascular hilar enlargement": ("Vascular Hilar Enlargement",),
    "hilar congestion": ("Vascular Hilar Enlargement",),  # organisers
    "pulmonary artery enlargement": ("Vascular Hilar Enlargement",),  # organisers
    "adenopathy": ("Adenopathy",),
    "goiter": ("Goiter",),
    "hiatal hernia": ("Hernia",),
    # --- diaphragm and abdomen
    "hemidiaphragm elevation": ("Hemidiaphragm Elevation",),
    "pneumoperitoneo": ("Pneumoperitoneum",),
    "subcutaneous emphysema": ("Subcutaneous Emphysema",),
    # --- bones
    "fracture": ("Fracture",),
    "rib fracture": ("Fracture",),
    "callus rib fracture": ("Fracture",),
    "clavicle fracture": ("Fracture",),
    "humeral fracture": ("Fracture",),
    "vertebral fracture": ("Fracture",),
    "kyphosis": ("Kyphosis",),
    "scoliosis": ("Scoliosis",),
    "osteopenia": ("Osteopenia",),
    "vertebral degenerative changes": ("Vertebral Degenerative Changes",),
    "vertebral compression": ("Vertebral Degenerative Changes",),
    "vertebral anterior compression": ("Vertebral Degenerative Changes",),
    # --- post-surgical: sternotomy is a class; the other surgical material is not a support device
    "sternotomy": ("Sternotomy",),
    # --- central venous catheters: a class of their own and, in the organisers' table, not a Support Device
    "central venous catheter": ("Central Venous Catheter",),
    "central venous catheter via jugular vein": ("Central Venous Catheter",),
    "central venous catheter via subclavian vein": ("Central Venous Catheter",),
    "central venous catheter via umbilical vein": ("Central Venous Catheter",),
    "reservoir central venous catheter": ("Central Venous Catheter",),
    # --- support devices: tubes, stents and electrical devices (organisers: not catheters, not chest drains)
    "NSG tube": ("Support Devices",),
    "endotracheal tube": ("Support Devices",),
    "tracheostomy tube": ("Support Devices",),
    "ventriculoperitoneal drain tube": ("Support Devices",),
    "gastrostomy tube": ("Support Devices",),
    "nephrostomy tube": ("Support Devices",),
    "double J stent": ("Support Devices",),
    "electrical device": ("Support Devices",),
    "pacemaker": ("Support Devices",),
    "dual chamber device": ("Support Devices",),
    "single chamber device": ("Support Devices",),
    "dai": ("Support Devices",),  # implantable defibrillator (Spanish DAI)
    # --- deliberately unmapped: no CXR-LT 2026 class contains these (the organisers' where marked)
    "catheter": (),  # organisers: a bare catheter, of no stated kind, is no Support Device
    "chest drain tube": (),  # organisers
    "pulmonary mass": (),  # organisers: no Mass
    "calcified pleural plaques": (),  # organisers: no Calcified Density
    "heart valve calcified": (),  # organisers: no Calcified Density
    "calcified fibroadenoma": (),  # organisers: no Calcified Density
    "infiltrates": (),  # the parent of both patterns: names neither one
    "increased density": (),
    "pneumonia": (),
    "atypical pneumonia": (),
    "COPD signs": (),
    "chronic changes": (),
    "unchanged": (),  # a comparison with an earlier study, not a finding
    "fibrotic band": (),
    "heart insufficiency": (),
    "pulmonary edema": (),
    "bronchovascular markings": (),
    "hilar enlargement": (),  # the parent of vascular hilar enlargement and adenopathy: names neither one
    "pulmonary fibrosis": (),
    "post radiotherapy changes": (),
    "asbestosis signs": (),
    "tuberculosis": (),
    "tuberculosis sequelae": (),
    "lung metastasis": (),
    "lymphangitis carcinomatosa": (),
    "lepidic adenocarcinoma": (),
    "bone metastasis": (),
    "abscess": (),
    "cyst": (),
    "air fluid level": (),
    "kerley lines": (),
    "vascular redistribution": (),
    "central vascular redistribution": (),
    "lung vascular paucity": (),
    "pulmonary hypertension": (),
    "pulmonary artery hypertension": (),
    "pulmonary venous hypertension": (),
    "respiratory distress": (),
    "pleural plaques": (),
    "fissure thickening": (),
    "minor fissure thickening": (),
    "major fissure thickening": (),
    "pericardial effusion": (),
    "pneumomediastinum": (),
    "mediastinal enlargement": (),  # the parent of aortic elongations, goiter, hernia...: names none of them
    "superior mediastinal enlargement": (),
    "mediastinal shift": (),
    "mediastinic lipomatosis": (),
    "lipomatosis": (),
    "tracheal shift": (),
    "azygoesophageal recess shift": (),
    "esophagic dilatation": (),
    "aortic aneurysm": (),
    "right sided aortic arch": (),
    "dextrocardia": (),
    "diaphragmatic eventration": (),
    "Chilaiditi sign": (),
    "thoracic cage deformation": (),  # the parent of kyphosis and scoliosis: names neither one
    "pectum excavatum": (),
    "pectum carinatum": (),
    "cervical rib": (),
    "osteoporosis": (),  # its own term in PadChest, not a child of osteopenia
    "axial hyperostosis": (),
    "sclerotic bone lesion": (),
    "blastic bone lesion": (),
    "lytic bone lesion": (),
    "costochondral junction hypertrophy": (),
    "sternoclavicular junction hypertrophy": (),
    "non axial articular degenerative changes": (),
    "subacromial space narrowing": (),
    "obesity": (),
    "gynecomastia": (),
    "surgery": (),
    "surgery breast": (),
    "surgery neck": (),
    "surgery lung": (),
    "surgery heart": (),
    "surgery humeral": (),
    "mastectomy": (),
    "suture material": (),
    "metal": (),
    "osteosynthesis material": (),
    "bone cement": (),
    "prosthesis": (),
    "humeral prosthesis": (),
    "mammary prosthesis": (),
    "endoprosthesis": (),
    "aortic endoprosthesis": (),
    "artificial heart valve": (),  # implants of the surgery branch, not tubes or electrical devices
    "artificial mitral heart valve": (),
    "artificial aortic heart valve": (),
    "abnormal foreign body": (),
    "external foreign body": (),
    # --- study flags, handled by the adapter (data.source.drop_excluded / drop_suboptimal), not labels
    "exclude": (),
    "suboptimal study": (),
}

#: Study-quality names: not findings, but columns of the manifest (``excluded``, ``suboptimal``).
EXCLUDE, SUBOPTIMAL = "exclude", "suboptimal study"


def pairs(rollup: dict[str, tuple[str, ...]] = ROLLUP) -> list[tuple[str, str]]:
    """``(PadChest name, class)`` for every mapped name, one pair per class it feeds."""
    return [(name, label) for name, labels in rollup.items() for label in labels]


def children(label: str, rollup: dict[str, tuple[str, ...]] = ROLLUP) -> list[str]:
    """The PadChest names whose union is ``label``."""
    return [name for name, labels in rollup.items() if label in labels]


def markdown_table(classes: Iterable[str], rollup: dict[str, tuple[str, ...]] = ROLLUP) -> str:
    """The roll-up as docs/data.md shows it: one row per class (its children, or none), then the unmapped names."""
    rows = ["| class | PadChest names (the class is their union) |", "|---|---|"]
    for label in classes:
        names = children(label, rollup)
        rows.append(f"| {label} | {', '.join(f'`{n}`' for n in names) if names else '(none in the table)'} |")
    unmapped = sorted((n for n, labels in rollup.items() if not labels), key=str.lower)
    rows.append(f"| (not mapped) | {', '.join(f'`{n}`' for n in unmapped)} |")
    return "\n".join(rows)
