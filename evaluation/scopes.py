"""Which rows of a test set are its pooled, internal and external tests (docs/rules.md §1, §3).

CXR-LT 2026 scores Task 2 on an internal test (PadChest-GR) and an external one (NIH), each on its own and never
only pooled. Kept apart from the unseen-class report so that ``make score`` splits a submission the same way
without importing a model stack.
"""

from __future__ import annotations

import numpy as np


def unseen_scopes(sources: np.ndarray | None, internal: str | None) -> dict[str, np.ndarray]:
    """Scope name (``pooled``, ``internal``, ``external``, ``source/<name>``) -> row indices of the test set.

    With one source or none there is only the pooled test; the internal/external pair needs a configured internal
    source that is among the test rows (the others together are the external test).
    """
    if sources is None or len(set(sources)) < 2:
        return {}
    scopes = {"pooled": np.arange(len(sources))}
    if internal is not None and internal in set(sources):
        scopes["internal"] = np.flatnonzero(sources == internal)
        scopes["external"] = np.flatnonzero(sources != internal)
    for name in sorted(set(sources)):
        scopes[f"source/{name}"] = np.flatnonzero(sources == name)
    return scopes
