"""The description bank: phrasings, a radiological description and prompt templates for every known finding.

Zero-shot scoring only knows a class through its text, so the text lives in one reviewed file
(``configs/text/descriptions.yaml``) rather than in code, with its sources, and its content hash keys the
embedding cache: editing a phrasing can never be scored with stale embeddings.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from training.config_files import config_file, project_file

DEFAULT_BANK = config_file("text", "descriptions.yaml")


class MissingDescriptionError(KeyError):
    """A class to be scored has no entry in the description bank."""


@dataclass(frozen=True)
class ClassText:
    """The text of one finding: synonyms to template, and a description sentence used as is."""

    phrasings: tuple[str, ...]
    description: str


@dataclass(frozen=True)
class DescriptionBank:
    """Parsed bank. ``templates`` maps ``positive``/``negative`` to format strings with one ``{}``."""

    classes: dict[str, ClassText]
    templates: dict[str, tuple[str, ...]]
    content_hash: str
    path: Path

    @classmethod
    def load(cls, path: str | Path | None = None) -> DescriptionBank:
        """Read and check a bank file (default: the project's); relative paths are tried from the project root."""
        path = project_file(path) if path else DEFAULT_BANK
        raw = yaml.safe_load(path.read_text())
        templates = {kind: tuple(raw["templates"][kind]) for kind in ("positive", "negative")}
        for kind, items in templates.items():
            bad = [t for t in items if t.count("{}") != 1]
            if not items or bad:
                raise ValueError(f"{path}: every {kind} template needs exactly one '{{}}'; bad: {bad or 'none given'}")
        classes = {}
        for name, entry in raw["classes"].items():
            phrasings = tuple(entry.get("phrasings") or ())
            if not phrasings or not entry.get("description"):
                raise ValueError(f"{path}: class {name!r} needs at least one phrasing and a description")
            classes[str(name)] = ClassText(phrasings, str(entry["description"]))
        canonical = json.dumps({"templates": templates, "classes": {k: vars(v) for k, v in classes.items()}},
                               sort_keys=True, default=list)  # fmt: skip
        return cls(classes, templates, hashlib.sha256(canonical.encode()).hexdigest()[:16], path)

    def missing(self, names: Iterable[str]) -> list[str]:
        """The names without an entry, in the order given."""
        return [name for name in names if name not in self.classes]

    def require(self, names: Iterable[str]) -> None:
        """Raise ``MissingDescriptionError`` naming every class the bank lacks."""
        missing = self.missing(names)
        if missing:
            raise MissingDescriptionError(f"{self.path} has no description for {missing}; add them under `classes:`")

    def prompts(self, name: str, kind: str = "positive", include_description: bool = True) -> list[list[str]]:
        """Texts of one class, grouped for ensembling: ``[templates x phrasings] (+ [[description]])``.

        Returns a list of groups: one group per template holding that template filled with each phrasing; the
        description (positive side only) is one more group of one sentence. ``ensemble`` averages them all.
        """
        self.require([name])
        entry = self.classes[name]
        groups = [[template.format(p) for p in entry.phrasings] for template in self.templates[kind]]
        if include_description and kind == "positive":
            groups.append([entry.description])
        return groups

    def flat_prompts(self, names: Sequence[str], kind: str = "positive", include_description: bool = True):
        """All texts of ``names`` in one list, and for each class the slice of its texts in it."""
        texts, spans = [], []
        for name in names:
            group = [t for g in self.prompts(name, kind, include_description) for t in g]
            spans.append(slice(len(texts), len(texts) + len(group)))
            texts.extend(group)
        return texts, spans
