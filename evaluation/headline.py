"""Which figures a run leads with: the metric sets of the classes its task is ranked on.

Task 2 is ranked on its six unseen findings only (docs/rules.md §1), while its runs also log the 30 seen classes
(``test/...``), which the challenge does not rank. A reader who meets the seen-class chain in the first table, the
first terminal line or the card's first row, under the challenge's name, compares it with the leaderboard and
compares two different things. So the task's config says which classes lead (``headline`` in
``configs/task/<task>.yaml``, default the ``test/...`` sets), and the report, the terminal summary, the card, the
registry's tie-breaks, the runs table's saved view and ``make compare`` all read it from here; none of them names a
task.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from evaluation.metric_registry import SUITE, UNSEEN_SETS, MetricSetName

#: The seen classes' metric sets in the order of :data:`UNSEEN_SETS`: test, its TTA copy, its perturbed copy, the
#: held-out draw (``evaluation.evaluate``, ``evaluation.heldout``).
SEEN_SETS = (
    MetricSetName("test", "test"),
    MetricSetName("test_tta", "test with TTA"),
    MetricSetName("test_perturbed", "test perturbed"),
    MetricSetName("heldout", "held-out subset"),
)
#: A headline's family of sets, by the prefix of its test set.
FAMILIES = {sets[0].prefix: sets for sets in (SEEN_SETS, UNSEEN_SETS)}


@dataclass(frozen=True)
class Headline:
    """The sets a task's runs lead with and the words for them.

    Attributes:
        sets: test, TTA, perturbed and held-out sets of the ranked classes (``SEEN_SETS`` or ``UNSEEN_SETS``).
        title: what the ranked classes are, where a line would otherwise not say (empty: the task's own labels).
        others: what the other family's figures are, where they still show after the headline (empty: nothing to
            say, as for a task ranked on its own labels).
    """

    sets: tuple[MetricSetName, ...] = SEEN_SETS
    title: str = ""
    others: str = ""

    @property
    def prefix(self) -> str:
        """The ranked test set's prefix: ``test`` or ``test_unseen``."""
        return self.sets[0].prefix

    @property
    def perturbed(self) -> str:
        return self.sets[2].prefix

    @property
    def heldout(self) -> str:
        return self.sets[3].prefix

    def name(self, metric_set: str) -> str:
        """``metric_set`` (a set's title) with the ranked classes' title in front, when the task gives one."""
        return f"{self.title}, {metric_set}" if self.title else metric_set

    def other(self, metric_set: str) -> str:
        """``metric_set`` titled as a figure the task is not ranked on, when the task says what those are."""
        return f"{self.others}, {metric_set}" if self.others else metric_set

    def ranks(self, metric_set: str) -> bool:
        """Whether ``metric_set`` (a prefix) is one of the ranked classes' sets."""
        return metric_set in {s.prefix for s in self.sets}

    def tie_breaks(self) -> tuple[tuple[str, bool], ...]:
        """The challenge's ranking chain on the ranked test set: ``(metric key, larger is better)`` in order."""
        return tuple((f"{self.prefix}/{m.name}", m.higher_is_better) for m in SUITE.tie_break_chain())


DEFAULT = Headline()
PARAM = "task.headline."  # how a run's logged config names the key (training.tracking.session.flatten)


def headline_of(task) -> Headline:
    """The headline a task config node (``cfg.task``, or a loaded ``configs/task/<task>.yaml``) declares.

    Raises:
        ValueError: ``headline.prefix`` names no family of metric sets (one line naming the field and the known
            prefixes).
    """
    node = task.get("headline") if task is not None and hasattr(task, "get") else None
    if not node:
        return DEFAULT
    prefix = str(node.get("prefix", DEFAULT.prefix))
    if prefix not in FAMILIES:
        name = task.get("name", "?")
        raise ValueError(f"task {name}: headline.prefix={prefix!r} names no metric set; known: {', '.join(FAMILIES)}")
    return Headline(FAMILIES[prefix], str(node.get("title") or ""), str(node.get("others") or ""))


def logged_headline(params: Mapping[str, str]) -> Headline:
    """The headline a run was trained with, from its logged config (``task.headline.prefix`` ... params); the
    default for a run whose task declared none."""
    node = {key.removeprefix(PARAM): value for key, value in params.items() if key.startswith(PARAM)}
    return headline_of({"name": params.get("task.name", "?"), "headline": node})
