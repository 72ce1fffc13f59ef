"""`make score TASK=task2 PREDICTIONS=<submission> MANIFEST=<release folder>`: the challenge's own Task 2 format
(`ImageID` and the six unseen columns in the organisers' spelling) scored on the internal and the external test
that the release's split information names, as the user types it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.metrics import average_precision_score

from tests.cxrlt2026_release import write_release
from training.data.findings import TASK2_LABELS
from training.data.label_names import ORGANISER_SPELLING

ROOT = Path(__file__).resolve().parents[2]


def test_make_score_task2_reports_internal_and_external_from_the_release(tmp_path):
    release = write_release(tmp_path / "release", n_train=4, n_dev=4, n_test=12, n_external=8, size=8)
    table = pd.read_csv(release.root / "labels.csv", dtype={"ImageID": str})
    test = table[table["split"].isin(["test", "external_test"])].reset_index(drop=True)
    columns = [ORGANISER_SPELLING[name] for name in TASK2_LABELS]
    rng = np.random.default_rng(11)
    submission = pd.DataFrame({"ImageID": test["ImageID"], **{c: rng.random(len(test)).round(4) for c in columns}})
    path = tmp_path / "task2_submission.csv"
    submission.to_csv(path, index=False)
    done = subprocess.run(
        ["make", "-s", "-o", "setup", "-o", ".venv/.installed", "score", "TASK=task2", f"PREDICTIONS={path}",
         f"MANIFEST={release.root}"],
        cwd=ROOT, env=os.environ, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    blocks = dict(zip(("all", "internal", "external"), done.stdout.split("\n\n"), strict=False))
    assert "20 images (pooled, resampled within source)" in blocks["all"]
    assert blocks["internal"].startswith("internal test (padchest), 12 images")
    assert blocks["external"].startswith("external test (nih), 8 images")
    for scope, rows in (("all", slice(None)), ("internal", test["split"] == "test"),
                        ("external", test["split"] == "external_test")):  # fmt: skip
        y, p = test.loc[rows, columns].to_numpy(), submission.loc[rows, columns].to_numpy()
        expected = np.mean([average_precision_score(y[:, c], p[:, c]) for c in range(len(columns)) if y[:, c].any()])
        assert f"1.  mAP         {expected:.4f}" in blocks[scope], (scope, expected, blocks[scope])
