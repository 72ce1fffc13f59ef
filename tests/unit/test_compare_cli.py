"""``make compare RUNS=...`` as the user types it (``apps.compare.main``), and ``make register``'s
``--require-significant`` gate, over finished runs in a real store.

The runs are written without training: what the comparison reads of a run is its stored predictions, its per-class
table and its ``task`` tag, all logged here as the test phase logs them.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from mlflow import MlflowClient

from apps.compare import NotSignificant, main, require_significant_gain
from evaluation.comparison import Settings
from evaluation.tables import PER_CLASS_TABLE
from tests.unit.test_paired import LABELS, _frame, _probs, _targets


def _finished_run(client, experiment, tmp_path, name, frame):
    run_id = client.create_run(experiment, run_name=name, tags={"task": "task1"}).info.run_id
    folder = tmp_path / run_id / "predictions"
    folder.mkdir(parents=True)
    frame.to_csv(folder / "test.csv", index=False)
    frame.to_csv(folder / "val.csv", index=False)  # the gate reads the split of the selection metric
    client.log_artifacts(run_id, str(folder), "predictions")
    table = pd.DataFrame({"class": LABELS, "group": ["common", "common", "medium", "rare"]})
    (tmp_path / run_id / "per_class.json").write_text(table.to_json(orient="split", index=False))
    client.log_artifact(run_id, str(tmp_path / run_id / "per_class.json"), PER_CLASS_TABLE.rsplit("/", 1)[0])
    client.set_terminated(run_id, "FINISHED")
    return run_id


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """``(uri, client, folder, runs)``: a run, the same with class ``a`` ranked backwards, one with an image fewer."""
    tmp = tmp_path_factory.mktemp("compare")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("task1", artifact_location=(tmp / "artifacts").as_uri())
    targets = _targets()
    probs = _probs(targets, 1, signal=0.5)
    flipped = probs.copy()
    flipped[:, 0] = 1 - flipped[:, 0]
    runs = {name: _finished_run(client, experiment, tmp, name, frame)
            for name, frame in (("good", _frame(targets, probs)), ("bad", _frame(targets, flipped)),
                                ("other", _frame(targets[:-1], probs[:-1])))}  # fmt: skip
    return uri, client, tmp, runs


def test_make_compare_logs_a_comparison_run_linked_from_each_run_and_refuses_another_test_set(
    store, monkeypatch, capsys
):
    uri, client, tmp, runs = store
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp)  # the comparison experiment's artifacts go under mlruns/artifacts here
    good, bad = runs["good"], runs["bad"]

    main([good, bad, "--n-boot", "300"])

    out = capsys.readouterr().out
    assert "good beats bad on mAP by" in out and "Holm" in out
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if "a_value" in line)
    assert lines[header].split()[:5] == ["a", "b", "metric", "a_value", "b_value"]  # as given: good, then bad
    assert lines[header + 1].split()[:2] == ["good", "bad"]
    report = next(line for line in lines if line.startswith("report: ")).removeprefix("report: ")
    assert report.startswith("file://") and Path(report.removeprefix("file://")).is_file()  # opens as printed
    compared_in = client.get_run(good).data.tags["cxrlt.compared_in"]
    assert client.get_run(bad).data.tags["cxrlt.compared_in"] == compared_in
    comparison = client.get_run(compared_in)
    assert client.get_experiment(comparison.info.experiment_id).name == "compare-task1"
    assert comparison.info.status == "FINISHED" and comparison.data.params["correction"] == "Holm"
    files = {f.path for f in client.list_artifacts(compared_in, "compare")}
    assert {"compare/report.html", "compare/per_class_ap.png", "compare/pairs.csv", "compare/per_class_ap.csv"} <= files
    per_class = pd.read_csv(client.download_artifacts(compared_in, "compare/per_class_ap.csv", str(tmp)))
    assert per_class.set_index("class").at["a", "bad mark"] == "worse"
    assert per_class["bad mark"].fillna("").eq("worse").sum() == 1
    assert np.isfinite(per_class["support"]).all()
    report = client.download_artifacts(compared_in, "compare/report.html", str(tmp / "r"))
    text = Path(report).read_text(encoding="utf-8")
    assert "data:image/png;base64," in text and "good beats bad on mAP" in text

    with pytest.raises(SystemExit) as exit_info:
        main([good, runs["other"], "--no-log"])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert f"were tested on different images: 1 only in run {good[:8]} (good)" in err and "Traceback" not in err


def test_require_significant_lets_a_clear_gain_through_and_refuses_a_loss(store):
    _, client, _, runs = store
    settings = Settings(n_boot=300)
    champion = SimpleNamespace(run_id=runs["bad"], version="1")
    assert "beats the champion significantly" in require_significant_gain(client, runs["good"], champion,
                                                                           "val/mAP", settings)  # fmt: skip
    champion = SimpleNamespace(run_id=runs["good"], version="2")
    with pytest.raises(NotSignificant, match="not registered: run .* does not beat the champion significantly"):
        require_significant_gain(client, runs["bad"], champion, "val/mAP", settings)
    assert "already is the champion" in require_significant_gain(client, runs["good"], champion, "val/mAP")
    assert "nothing to beat" in require_significant_gain(client, runs["good"], None, "val/mAP")
    with pytest.raises(NotSignificant, match="'val/proxy_ood_mAP' is not one"):
        require_significant_gain(client, runs["bad"], champion, "val/proxy_ood_mAP")
