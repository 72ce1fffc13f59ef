"""`make score TASK=task2 PREDICTIONS=<submission> MANIFEST=<label table in the organisers' layout>`, as the user
types it: `ImageID` and the six unseen columns in the organisers' spelling (`goiter`), scored as scikit-learn does."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.metrics import average_precision_score

from evaluation.organiser_names import TASK2_COLUMNS
from tests.cxrlt2026_release import DEV_LABELS, write_release

ROOT = Path(__file__).resolve().parents[2]


def test_make_score_task2_on_the_organisers_layout(tmp_path):
    release = write_release(tmp_path / "release", n_train=4, n_task1=2, n_task2=20, size=8)
    table = pd.read_csv(release.root / DEV_LABELS["task2"], dtype={"ImageID": str})
    columns = list(TASK2_COLUMNS.values())
    rng = np.random.default_rng(11)
    submission = pd.DataFrame({"ImageID": table["ImageID"], **{c: rng.random(len(table)) for c in columns}})
    path = tmp_path / "task2_submission.csv"
    submission.to_csv(path, index=False)
    done = subprocess.run(
        ["make", "-s", "-o", "setup", "-o", ".venv/.installed", "score", "TASK=task2", f"PREDICTIONS={path}",
         f"MANIFEST={release.root / DEV_LABELS['task2']}"],
        cwd=ROOT, env=os.environ, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "organisers' layout, all 20 rows" in done.stdout
    y, p = table[columns].to_numpy(), submission[columns].to_numpy()
    expected = np.mean([average_precision_score(y[:, c], p[:, c]) for c in range(len(columns)) if y[:, c].any()])
    assert f"1.  mAP         {expected:.4f}" in done.stdout, done.stdout
