"""One place mapping finding names between spellings: the paper's, the organisers' columns, and other releases.

The organisers' files mix cases and languages (``pneumoperitoneo``; the exact table is
:mod:`evaluation.organiser_names`) and users' exports add underscores; adapters read any of these through
:func:`canonical_name` and the submission writer writes the organisers' columns, so a spelling difference can
never silently create an all-negative class.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from evaluation.organiser_names import ORGANISER_SPELLING
from training.data.findings import KNOWN_FINDINGS


def normalise(name: str) -> str:
    """Case-, space-, underscore- and hyphen-insensitive key: ``'Pleural_Effusion ' -> 'pleural effusion'``."""
    return re.sub(r"[\s_\-]+", " ", str(name)).strip().lower()


#: Further spellings seen in other releases, normalised key -> paper name; the organisers' spellings that differ
#: from the paper's by more than case (``pneumoperitoneo``) come from their table.
ALIASES: dict[str, str] = {
    "effusion": "Pleural Effusion",  # NIH's name for the same finding, when mapping into CXR-LT names
    "pleural_thickening": "Pleural Thickening",
    "cvc": "Central Venous Catheter",
    "hiatal hernia": "Hernia",
    "lymphadenopathy": "Adenopathy",
    **{
        normalise(column): paper
        for paper, column in ORGANISER_SPELLING.items()
        if normalise(column) != normalise(paper)
    },
}


def canonical_name(name: str, vocabulary: Iterable[str] = KNOWN_FINDINGS) -> str | None:
    """The vocabulary's spelling of ``name``, or None when it names no known finding.

    An exact match wins; then a normalised match; then an alias whose target is in the vocabulary.
    """
    vocabulary = tuple(vocabulary)
    if name in vocabulary:
        return name
    key = normalise(name)
    by_key = {normalise(v): v for v in reversed(vocabulary)}  # on a collision the earlier (CXR-LT) name wins
    if key in by_key:
        return by_key[key]
    target = ALIASES.get(key)
    return target if target in vocabulary else None


#: REVEAL-CXR's 12 benchmark labels (docs/benchmarks.md, REVEAL-CXR), in the benchmark's own spelling.
REVEAL_LABELS: tuple[str, ...] = (
    "airspace opacity", "aneurysm", "cardiomegaly", "COPD", "hiatal hernia", "interstitial opacity", "lung mass",
    "lung nodule", "lymphadenopathy", "pleural effusion", "pleural thickening", "pneumothorax",
)  # fmt: skip

#: Benchmark label -> (model outputs that answer it, in any release's spelling; why those). A platform model's score
#: for the label is the highest probability among the outputs it has; a label none of whose outputs it has is
#: reported as n/a with the reason, never dropped.
REVEAL_OUTPUTS: dict[str, tuple[tuple[str, ...], str]] = {
    "airspace opacity": (
        ("Airspace Opacity", "Consolidation", "Pneumonia", "Infiltration", "Infiltrate", "Alveolar Pattern"),
        "alveolar filling: the highest of the consolidation-, pneumonia- and infiltration-type outputs",
    ),
    "aneurysm": (
        ("Aneurysm", "Aortic Aneurysm"),
        "only an output named for aneurysm: aortic elongation and atheromatosis are not a focal dilation",
    ),
    "cardiomegaly": (("Cardiomegaly",), "same finding"),
    "COPD": (
        ("COPD", "Chronic Obstructive Pulmonary Disease", "Emphysema", "Hyperinflated Lung"),
        "emphysema and hyperinflation are the radiographic signs the benchmark's definition names",
    ),
    "hiatal hernia": (("Hiatal Hernia", "Hernia"), "NIH's and PadChest's hernia is almost always hiatal"),
    "interstitial opacity": (
        ("Interstitial Opacity", "Interstitial Pattern", "Fibrosis"),
        "linear/reticular opacities: the interstitial-pattern and fibrosis outputs",
    ),
    "lung mass": (("Lung Mass", "Mass"), "same finding (> 3 cm)"),
    "lung nodule": (("Lung Nodule", "Nodule"), "same finding (<= 3 cm)"),
    "lymphadenopathy": (("Lymphadenopathy", "Adenopathy"), "PadChest's name for the same finding"),
    "pleural effusion": (("Pleural Effusion", "Effusion"), "NIH's name for the same finding"),
    "pleural thickening": (("Pleural Thickening",), "same finding"),
    "pneumothorax": (("Pneumothorax",), "same finding"),
}


#: CheXTemporal's 11 findings (CheXpert/CheXbert names), in the dataset paper's order.
CHEXTEMPORAL_FINDINGS: tuple[str, ...] = (
    "Atelectasis", "Cardiomegaly", "Consolidation", "Edema", "Enlarged Cardiomediastinum", "Lung Lesion",
    "Lung Opacity", "Pleural Effusion", "Pleural Other", "Pneumonia", "Pneumothorax",
)  # fmt: skip

#: CheXpert finding -> (model outputs that answer it, in any release's spelling; why those). Used both for a
#: model's score (highest probability among the outputs it has) and to label NIH follow-up pairs in CheXpert names
#: (a finding is present when any of its NIH columns is).
CHEXPERT_OUTPUTS: dict[str, tuple[tuple[str, ...], str]] = {
    "Atelectasis": (("Atelectasis",), "same finding"),
    "Cardiomegaly": (("Cardiomegaly",), "same finding"),
    "Consolidation": (("Consolidation",), "same finding"),
    "Edema": (("Edema",), "same finding"),
    "Enlarged Cardiomediastinum": (("Enlarged Cardiomediastinum",), "only the same finding: cardiomegaly is narrower"),
    "Lung Lesion": (("Lung Lesion", "Mass", "Nodule"), "CheXpert's lesion covers NIH's mass and nodule"),
    "Lung Opacity": (
        ("Lung Opacity", "Infiltration", "Infiltrate", "Airspace Opacity", "Alveolar Pattern"),
        "CheXpert's opacity: NIH's infiltration, PadChest's alveolar pattern",
    ),
    "Pleural Effusion": (("Pleural Effusion", "Effusion"), "NIH's name for the same finding"),
    "Pleural Other": (
        ("Pleural Other", "Pleural Thickening"),
        "pleural thickening is the commonest other pleural finding",
    ),
    "Pneumonia": (("Pneumonia",), "same finding"),
    "Pneumothorax": (("Pneumothorax",), "same finding"),
}


#: ROCOv2 (ImageCLEFmedical 2024 Caption) concepts that describe an NIH chest film's acquisition, in ROCOv2's own
#: vocabulary (UMLS CUIs): every NIH film is a plain radiograph of the chest, PA or AP. The four are among the
#: release's manually validated concepts (``*_concepts_manual.csv``: modality, body region, direction).
ROCOV2_PLAIN_RADIOGRAPH = "C1306645"  # modality "Plain x-ray"
ROCOV2_CHEST = "C0817096"  # body region "Chest"
ROCOV2_VIEW_CUIS: dict[str, str] = {"PA": "C1996865", "AP": "C1999039"}  # "Postero-Anterior", "Antero-Posterior"

#: NIH ChestX-ray14 finding (``Data_Entry_2017`` spelling) -> the UMLS CUI ROCOv2 uses for it. "No Finding" has no
#: concept: such a film carries only its acquisition concepts (above). Evidence, checked on ROCOv2's own tables
#: (``../shared/data/rocov2-text``: how many of the 59,962 training images carry the CUI, and how many of the
#: valid/test images carrying it have a caption naming the finding); CUIs ROCOv2 never uses are marked UNSURE:
#: they are the UMLS concept as we know it, not checked against a UMLS release here, and a model trained on ROCOv2
#: can never predict them.
NIH_FINDING_CUIS: dict[str, str] = {
    "Atelectasis": "C0004144",  # "Atelectasis": 193 train; 88/97 captions say atelectasis
    # UNSURE of the UMLS name: ROCOv2 never uses C0018800 ("Cardiomegaly"); C2733397 is the concept its captions
    # saying cardiomegaly carry (228 train; 75/84 captions say cardiomegaly).
    "Cardiomegaly": "C2733397",
    "Consolidation": "C0521530",  # UNSURE: UMLS "Lung consolidation"; absent from ROCOv2 (no concept of its own)
    "Edema": "C0034063",  # "Pulmonary edema": 128 train; 45/45 captions say edema/oedema
    "Effusion": "C0032227",  # "Pleural effusion": 746 train; 303/303 captions say effusion
    # ROCOv2's emphysema concept (89 train; 28/28 captions say emphysema), UMLS "Emphysema"; "Pulmonary emphysema"
    # C0034067 never occurs in ROCOv2.
    "Emphysema": "C0013990",
    "Fibrosis": "C0034069",  # "Pulmonary fibrosis": 25 train; 10/11 captions say fibrosis
    # UNSURE of the UMLS name: NIH's hernia is hiatal; ROCOv2 never uses "Hiatal hernia" C0019291, and C3489393 is
    # the concept of its hiatal-hernia captions (26 train; 23/24 captions say hiatal).
    "Hernia": "C3489393",
    "Infiltration": "C0332448",  # "Infiltration": 417 train; 128/128 captions say infiltrat*
    # UNSURE: UMLS "Mass of body structure"; ROCOv2 has no lung-mass concept. (C0024109, sometimes quoted for
    # "mass of lung", is UMLS "Lung", the organ.)
    "Mass": "C0577559",
    "Nodule": "C0028259",  # "Nodule": 738 train; 294/294 captions say nodule ("Lung nodule" C0034079 never occurs)
    "Pleural_Thickening": "C0264545",  # UNSURE: UMLS "Pleural thickening"; absent from ROCOv2
    "Pneumonia": "C0032285",  # "Pneumonia": 178 train; 87/98 captions say pneumonia
    "Pneumothorax": "C0032326",  # "Pneumothorax": 313 train; 145/145 captions say pneumothorax
}
