"""All finding rules, gathered into one registry: :data:`RULES` maps each finding name to its rule.

Importing the topic modules registers their rules (decorators in :mod:`rules`). ``Normal`` has an empty rule:
a normal film is just the anatomy. The check below makes a missing or misspelled rule fail at import time
rather than silently producing an undrawn label.
"""

from __future__ import annotations

from training.data.synthetic import (  # noqa: F401  (imported for their registrations)
    findings_bone,
    findings_cardio,
    findings_devices,
    findings_lung,
    findings_pleura,
)
from training.data.synthetic.labels import FINDINGS, NORMAL
from training.data.synthetic.rules import RULES, FindingRule

RULES.setdefault(NORMAL, FindingRule(NORMAL))

_missing = sorted(set(FINDINGS) - set(RULES))
_unknown = sorted(set(RULES) - set(FINDINGS))
if _missing or _unknown:
    raise RuntimeError(f"finding rules out of sync: missing {_missing}, unknown {_unknown}")

__all__ = ["RULES"]
