"""The terminal of a training: the framework's noise filtered, the run's summary complete."""

from __future__ import annotations

import logging

from evaluation.intervals import CI_RULE
from evaluation.report import summary_lines
from training.console import QuietProgressBar, quiet_lightning


def test_lightning_noise_is_dropped_and_everything_else_kept(caplog):
    quiet_lightning()
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    with caplog.at_level(logging.INFO, logger="lightning.pytorch.utilities.rank_zero"):
        for message in ("GPU available: False, used: False", "TPU available: False, using: 0 TPU cores",
                        "💡 Tip: For seamless cloud logging ...", "Seed set to 42", "`Trainer.fit` stopped"):  # fmt: skip
            logger.info(message)
    assert [r.getMessage() for r in caplog.records] == ["Seed set to 42", "`Trainer.fit` stopped"]


def test_progress_bar_hides_the_run_id(monkeypatch):
    monkeypatch.setattr("lightning.pytorch.callbacks.RichProgressBar.get_metrics",
                        lambda self, trainer, module: {"loss": 0.3, "v_num": "163f12ce"})  # fmt: skip
    assert QuietProgressBar().get_metrics(None, None) == {"loss": 0.3}


def test_summary_has_headline_groups_tta_perturbed_and_unseen():
    metrics = {"test/mAP": 0.258, "test/mAP_ci_low": 0.251, "test/mAP_ci_high": 0.283, "test/mAUROC": 0.774,
               "test/mF1": 0.2, "test/mECE": 0.05, "test/prevalence_baseline_mAP": 0.062,
               "test/group/common/mAP": 0.613, "test/group/rare/mAP": 0.027, "test_tta/mAP": 0.25,
               "test_perturbed/mAP": 0.102, "test_perturbed/delta/mAP": -0.156}  # fmt: skip
    unseen = {"test_unseen/mAP": 0.11, "test_unseen/mAP_ci_low": 0.09, "test_unseen/mAP_ci_high": 0.13,
              "test_unseen/mAUROC": 0.55}  # fmt: skip
    lines = summary_lines(metrics, unseen)
    assert lines[0] == ("test (ranking chain; lower mECE wins): mAP 0.258 [0.251, 0.283], mAUROC 0.774, mF1 0.200, "
                        "mECE 0.050, mPrecision -, mRecall - (prevalence baseline mAP 0.062)")  # fmt: skip
    assert lines[1:] == [CI_RULE, "mAP by group: common 0.613 / rare 0.027", "mAP with TTA: 0.250",
                         "mAP perturbed: 0.102 (-0.156)",
                         "unseen classes: mAP 0.110 [0.090, 0.130], mAUROC 0.550, mF1 -, mECE -, mPrecision -, "
                         "mRecall -"]  # fmt: skip
