"""The LightningModule's epoch metrics follow the challenge's macro rules, checked against sklearn."""

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score, roc_auc_score

from training.models.module import MultiLabelClassifier

MODEL = {"backbone": "resnet10t", "pretrained": False, "lr": 1e-3, "weight_decay": 0.0}
LOSS = {"name": "bce", "_target_": "training.losses.bce.BCELoss"}


@pytest.fixture
def module():
    labels = ["Normal", "A", "B", "C"]
    model = MultiLabelClassifier(MODEL, LOSS, labels)
    model.set_label_statistics(np.array([500, 300, 20, 0]), 1000)
    logged = {}
    model.log = lambda key, value, **kwargs: logged.__setitem__(key, float(value))
    return model, logged


def test_validation_macro_skips_undefined_classes_and_groups_by_training_prevalence(module):
    model, logged = module
    rng = np.random.default_rng(0)
    targets = (rng.random((64, 4)) < [0.4, 0.3, 0.1, 0.0]).astype(int)
    targets[:5, 1] = -1  # unlabelled entries are ignored
    probs = rng.random((64, 4))
    for chunk in np.array_split(np.arange(64), 4):  # several batches, as in an epoch
        model.val_metrics.update(torch.tensor(probs[chunk], dtype=torch.float32), torch.tensor(targets[chunk]))
    model.on_validation_epoch_end()

    def ap(c):
        keep = targets[:, c] >= 0
        return average_precision_score(targets[keep, c], probs[keep, c])

    def auc(c):
        keep = targets[:, c] >= 0
        return roc_auc_score(targets[keep, c], probs[keep, c])

    assert logged["val/mAP"] == pytest.approx(np.mean([ap(0), ap(1), ap(2)]), abs=1e-6)  # class C has no positive
    assert logged["val/mAUROC"] == pytest.approx(np.mean([auc(0), auc(1), auc(2)]), abs=1e-6)
    assert logged["val/group/normal/mAP"] == pytest.approx(ap(0), abs=1e-6)
    assert logged["val/group/common/mAP"] == pytest.approx(ap(1), abs=1e-6)
    assert logged["val/group/medium/mAP"] == pytest.approx(ap(2), abs=1e-6)
    assert "val/group/very_rare/mAP" not in logged


def test_training_prevalence_survives_a_checkpoint_round_trip(module):
    model, _ = module
    clone = MultiLabelClassifier(MODEL, LOSS, ["Normal", "A", "B", "C"])
    clone.load_state_dict(model.state_dict())
    assert clone.groups == model.groups == {"normal": [0], "common": [1], "medium": [2], "very_rare": [3]}


def test_loss_bias_initialisation_reaches_the_head():
    model = MultiLabelClassifier(
        MODEL, {"name": "db", "_target_": "training.losses.db.DistributionBalancedLoss"}, ["A", "B"]
    )
    model.set_label_statistics(np.array([100, 10]), 1000)
    expected = model.loss.init_bias()
    assert expected is not None
    torch.testing.assert_close(model.head.bias.data, expected)


@pytest.mark.parametrize("num_labels", [1, 3])
def test_per_class_metrics_match_sklearn_and_a_class_without_labels_is_nan(num_labels):
    """A class whose cells are all -1 in the split (an external set without that finding) is NaN, not an error."""
    from sklearn.metrics import average_precision_score, roc_auc_score

    from training.models.module import per_class_metrics

    rng = np.random.default_rng(0)
    target = (rng.random((50, num_labels)) < 0.6).astype(np.int64)
    probs = np.clip(target * 0.3 + rng.random((50, num_labels)) * 0.7, 0, 1)
    target[:3] = -1  # ignored
    if num_labels > 1:
        target[:, 1] = -1  # no labelled cell at all
    metrics = per_class_metrics(num_labels)
    for metric in metrics.values():
        for rows in (slice(0, 20), slice(20, 50)):  # two batches
            metric.update(torch.as_tensor(probs[rows], dtype=torch.float32), torch.as_tensor(target[rows]))
    ap, auroc = metrics["ap"].compute(), metrics["auroc"].compute()
    assert ap.shape == auroc.shape == (num_labels,)
    for column in range(num_labels):
        keep = target[:, column] >= 0
        if not keep.any():
            assert ap[column].isnan() and auroc[column].isnan()
            continue
        expected_ap = average_precision_score(target[keep, column], probs[keep, column])
        assert ap[column].item() == pytest.approx(expected_ap, abs=1e-5)
        assert auroc[column].item() == pytest.approx(roc_auc_score(target[keep, column], probs[keep, column]), abs=1e-5)
    for metric in metrics.values():  # a new epoch starts empty
        metric.reset()
        metric.update(torch.as_tensor(probs[:10], dtype=torch.float32), torch.as_tensor(target[:10]))
    keep = target[:10, 0] >= 0
    assert metrics["ap"].compute()[0].item() == pytest.approx(
        average_precision_score(target[:10][keep, 0], probs[:10][keep, 0]), abs=1e-5
    )
