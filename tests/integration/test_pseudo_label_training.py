"""`make pseudo-label` end to end on the session's smoke champion: another manifest (synthetic images, emptied cells,
a class it lacks, a class the model does not know) comes back with exactly the model's calls at its validation
thresholds in the empty cells of the splits it fills and nothing else changed, and `make train ... data=pseudo_labelled` trains one
smoke epoch on it, tagging how many cells are pseudo-labels."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pandas as pd
import pytest
from mlflow import MlflowClient

from apps.serving import Scorer
from tests.conftest import PROJECT_ROOT
from training.data.pseudo_labels import record_path

pytestmark = pytest.mark.e2e  # predicts and trains through the real commands: make test-e2e (docs/development.md)

EMPTIED = ("Cardiomegaly", "Pleural Effusion", "Nodule")  # every second row and every val row lose these cells
DROPPED = "Hernia"  # a class of the model's the manifest lacks: a new column, train and val rows filled
FOREIGN = "Infiltration"  # a known finding the task1 model does not predict: copied as written
TRAIN = ("debug=smoke", "trainer.max_epochs=1", "evaluation.n_boot=20", "evaluation.per_source=false",
         "tta.enabled=false", "evaluation.perturbation.enabled=false", "evaluation.plots=false",
         "trainer.enable_progress_bar=false")  # fmt: skip


def make(env: dict, *args: str) -> subprocess.CompletedProcess:
    """The command the user types, against the test's store."""
    return subprocess.run(["make", "-s", *args], env=env, capture_output=True, text=True, timeout=900,
                          cwd=PROJECT_ROOT)  # fmt: skip


def other_manifest(smoke_manifest, folder):
    """48 train, 16 val and 16 test rows of the smoke set, with cells emptied, one class dropped, one added."""
    table = pd.read_csv(smoke_manifest, dtype=str, keep_default_na=False)
    table = pd.concat([table[table["split"] == s].head(n) for s, n in (("train", 48), ("val", 16), ("test", 16))])
    table = table.reset_index(drop=True).drop(columns=[DROPPED])
    empty = (table.index % 2 == 0) | (table["split"] == "val")  # half the train and test rows, every val row
    table.loc[empty, list(EMPTIED)] = ""
    table[FOREIGN] = np.where(table.index % 3 == 0, "1", "")
    path = folder / "other.csv"
    table.to_csv(path, index=False)
    return path, table


def test_pseudo_labels_fill_the_empty_cells_of_chosen_splits_and_train(smoke_champion, smoke_data, tmp_path):
    env, client, run = smoke_champion
    root = smoke_data[1].parent
    manifest, before = other_manifest(smoke_data[1], tmp_path)
    out = tmp_path / "pseudo.csv"
    done = make(env, "pseudo-label", f"MODEL={run.info.run_id}", f"MANIFEST={manifest}", f"ROOT={root}", f"OUT={out}",
                "SPLITS=train val")  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    after = pd.read_csv(out, dtype=str, keep_default_na=False)

    scorer = Scorer.load(run.info.run_id, client)  # the model and its validation thresholds, the public way
    labels, thresholds = scorer.finished.labels, np.array(scorer.thresholds)
    # train and val filled: a val split with a class no cell labels stops validation (torchmetrics' curve fails)
    predicted = before.index[before["split"].isin(["train", "val"])]
    probs = scorer.predict_files([root / p for p in before.loc[predicted, "path"]])[:, : len(labels)]
    record = json.loads(record_path(out).read_text())
    assert record["source_run"] == run.info.run_id and record["thresholds_mode"] == "per_class"
    np.testing.assert_allclose([record["thresholds"][name] for name in labels], thresholds)

    total = 0
    for c, name in enumerate(labels):  # the emptied cells, the dropped class, and any cell the smoke set leaves empty
        was_empty = before[name] == "" if name in before else pd.Series(True, index=before.index)
        filled = (was_empty & (before["split"] != "test")).to_numpy()
        expected = np.where(probs[:, c] >= thresholds[c], "1", "0")
        clear = np.abs(probs[:, c] - thresholds[c]) > 1e-6  # a cell on the threshold could flip in the last bit
        on_rows = filled[predicted]
        assert (after.loc[predicted, name].to_numpy()[on_rows & clear] == expected[on_rows & clear]).all(), name
        assert (after.loc[was_empty & ~filled, name] == "").all(), f"{name}: a test cell was filled"
        if name in before:
            assert (after.loc[~was_empty, name] == before.loc[~was_empty, name]).all(), f"{name}: labelled cell changed"
        cells = record["cells"].get(name, {"1": [], "0": []})
        assert sorted(cells["1"] + cells["0"]) == sorted(after.loc[filled, "image_id"])
        assert sorted(cells["1"]) == sorted(after.loc[filled & (after[name] == "1"), "image_id"])
        total += int(filled.sum())
    untouched = [c for c in before.columns if c not in labels]
    pd.testing.assert_frame_equal(after[untouched], before[untouched])  # metadata and FOREIGN as written
    assert total >= 3 * (24 + 16) + 64  # at least: the emptied classes on half the train rows and every val row,
    # the dropped class on every train and val row

    # a store of its own: the champion's task1 experiment stays as the other tests sharing it expect
    own = {**env, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db"}
    done = make(own, "train", "TASK=task1", "ARGS=" + " ".join((*TRAIN, "data=pseudo_labelled",
                f"data.source.manifest={out}", f"tracking.artifact_root={tmp_path}/artifacts",
                f"tracking.checkpoint_root={tmp_path}/checkpoints")))  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    store = MlflowClient(own["MLFLOW_TRACKING_URI"])
    trained = store.search_runs([store.get_experiment_by_name("task1").experiment_id])
    assert len(trained) == 1 and trained[0].info.status == "FINISHED"
    assert trained[0].data.tags["data_source"] == "pseudo_labelled"
    assert trained[0].data.tags["cxrlt.pseudo_labels.cells"] == str(total)
    assert trained[0].data.tags["cxrlt.pseudo_labels.source_run"] == run.info.run_id


def test_unknown_run_is_one_line(smoke_champion, smoke_data, tmp_path):
    env, _, _ = smoke_champion
    manifest, _ = other_manifest(smoke_data[1], tmp_path)
    done = make(env, "pseudo-label", "MODEL=0123456789abcdef0123456789abcdef", f"MANIFEST={manifest}",
                f"ROOT={smoke_data[1].parent}", f"OUT={tmp_path / 'out.csv'}")  # fmt: skip
    assert done.returncode != 0 and done.stderr.startswith("error: "), done.stderr[-2000:]
    assert "0123456789abcdef0123456789abcdef" in done.stderr.splitlines()[0] and "Traceback" not in done.stderr
    assert not (tmp_path / "out.csv").exists()
