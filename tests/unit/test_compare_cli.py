"""``make compare RUNS=...`` as the user types it (``apps.compare.main``) over finished runs in a real store.

The runs are written without training: what the comparison reads of a run is its ``predictions/test.csv``, its
per-class table and its ``task`` tag, all logged here as the test phase logs them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from mlflow import MlflowClient

from apps.compare import main
from evaluation.tables import PER_CLASS_TABLE
from tests.unit.test_paired import LABELS, _frame, _probs, _targets


def _finished_run(client, experiment, tmp_path, name, frame):
    run_id = client.create_run(experiment, run_name=name, tags={"task": "task1"}).info.run_id
    folder = tmp_path / run_id / "predictions"
    folder.mkdir(parents=True)
    frame.to_csv(folder / "test.csv", index=False)
    client.log_artifacts(run_id, str(folder), "predictions")
    table = pd.DataFrame({"class": LABELS, "group": ["common", "common", "medium", "rare"]})
    (tmp_path / run_id / "per_class.json").write_text(table.to_json(orient="split", index=False))
    client.log_artifact(run_id, str(tmp_path / run_id / "per_class.json"), PER_CLASS_TABLE.rsplit("/", 1)[0])
    client.set_terminated(run_id, "FINISHED")
    return run_id


def test_make_compare_logs_a_comparison_run_linked_from_each_run_and_refuses_another_test_set(
    tmp_path, monkeypatch, capsys
):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)  # the comparison experiment's artifacts go under mlruns/artifacts here
    client = MlflowClient(uri)
    experiment = client.create_experiment("task1", artifact_location=(tmp_path / "artifacts").as_uri())
    targets = _targets()
    probs = _probs(targets, 1, signal=0.5)
    flipped = probs.copy()
    flipped[:, 0] = 1 - flipped[:, 0]
    good = _finished_run(client, experiment, tmp_path, "good", _frame(targets, probs))
    bad = _finished_run(client, experiment, tmp_path, "bad", _frame(targets, flipped))

    main([good, bad, "--n-boot", "300"])

    out = capsys.readouterr().out
    assert "good beats bad on mAP by" in out and "Holm" in out
    compared_in = client.get_run(good).data.tags["cxrlt.compared_in"]
    assert client.get_run(bad).data.tags["cxrlt.compared_in"] == compared_in
    comparison = client.get_run(compared_in)
    assert client.get_experiment(comparison.info.experiment_id).name == "compare-task1"
    assert comparison.info.status == "FINISHED" and comparison.data.params["correction"] == "Holm"
    files = {f.path for f in client.list_artifacts(compared_in, "compare")}
    assert {"compare/report.html", "compare/per_class_ap.png", "compare/pairs.csv", "compare/per_class_ap.csv"} <= files
    per_class = pd.read_csv(client.download_artifacts(compared_in, "compare/per_class_ap.csv", str(tmp_path)))
    assert per_class.set_index("class").at["a", "bad mark"] == "worse"
    assert per_class["bad mark"].fillna("").eq("worse").sum() == 1
    report = client.download_artifacts(compared_in, "compare/report.html", str(tmp_path / "r"))
    text = Path(report).read_text(encoding="utf-8")
    assert "data:image/png;base64," in text and "good beats bad on mAP" in text

    other = _frame(targets[:-1], probs[:-1])  # one test image fewer
    third = _finished_run(client, experiment, tmp_path, "other", other)
    with pytest.raises(SystemExit) as exit_info:
        main([good, third, "--no-log"])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert f"were tested on different images: 1 only in run {good[:8]} (good)" in err and "Traceback" not in err
    assert np.isfinite(per_class["support"]).all()
