"""Proxy-OOD validation as class folds (``adapter.proxy.size: null``): Task 2 row B's three proxy splits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score

from training.zeroshot.proxy_ood import ProxyOOD, proxy_splits
from training.zeroshot.semantic import SemanticHead


def test_three_folds_of_the_30_seen_classes_are_disjoint_and_cover_each_class_once():
    folds = proxy_splits(30, k=3, size=None, seed=0)
    assert [len(f) for f in folds] == [10, 10, 10]
    assert sorted(c for f in folds for c in f) == list(range(30))  # each class pseudo-unseen exactly once
    assert all(set(a).isdisjoint(b) for i, a in enumerate(folds) for b in folds[i + 1 :])
    assert folds == proxy_splits(30, k=3, size=None, seed=0) != proxy_splits(30, k=3, size=None, seed=1)
    uneven = proxy_splits(7, k=3, size=None, seed=0)  # 7 = 3 + 2 + 2
    assert sorted(len(f) for f in uneven) == [2, 2, 3] and sorted(c for f in uneven for c in f) == list(range(7))
    with pytest.raises(ValueError, match="k must be in"):
        proxy_splits(30, k=1, size=None)  # one fold would leave no pseudo-seen class


def test_uneven_folds_score_each_fold_and_average_them():
    """The selection metric is the plain mean over the folds of each fold's pseudo-unseen mAP."""
    torch.manual_seed(2)
    n = 7
    proxy = ProxyOOD(lambda: SemanticHead(4, torch.nn.functional.normalize(torch.randn(n, 5), dim=-1)), n, k=3,
                     size=None, seed=0)  # fmt: skip
    features = torch.randn(60, 4)
    targets = (torch.rand(60, n) < 0.4).float()
    proxy.update(features, targets)
    values = proxy.compute()
    expected = []
    for head, unseen in zip(proxy.heads, proxy.splits, strict=True):
        scores = head(features).detach()[:, unseen].numpy()
        expected.append(np.mean([average_precision_score(targets[:, c], scores[:, j]) for j, c in enumerate(unseen)]))
    for i, value in enumerate(expected):
        assert float(values[f"direct/split{i}/mAP"]) == pytest.approx(value, abs=1e-5)
    assert float(values["mAP"]) == pytest.approx(np.mean(expected), abs=1e-5)
