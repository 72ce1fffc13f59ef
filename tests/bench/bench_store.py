"""A store at scale (issue 31, point 3): 300 finished runs of the default metric set, and what the platform's
store-reading commands cost on it next to MLflow's own ``search_runs`` over the same runs.

Why a ratio to ``search_runs``: every command here has to read the runs from the store at least once, and MLflow's
own query is the floor for that read on this machine and this store. A ratio near 1 (plus a command's fixed start
cost) says the platform adds nothing that grows with the store; a large one points at work the platform does per
run or per metric (every run's full metric history, one REST or SQL call per run, ...).

The store is filled without training, through ``MlflowClient.log_batch``: one finished run made by
``tests.finished_runs.fabricate_finished_run`` (config and weights, so ``make register`` can package it), plus
runs carrying what a default Task 1 run logs: the flattened config as params, the training and validation history
per epoch, system metrics, and the test phase's metric sets (``test/`` with its per-class values, ``test_tta/``,
``test_perturbed/`` with its deltas, ``heldout/``, per-source sets), whose keys come from
``evaluation.suite.compute_suite`` itself so they follow the metric registry. Compared runs hold a
``predictions/test.csv`` and ``evaluation/per_class.json`` on one shared test set. The filled store is cached
under ``/tmp/cxrlt-bench-store/<VERSION>`` and every timing works on a fresh copy of it, so a rerun does not refill
and ``make register``/``make compare`` writing into it (a model version, a comparison run) never leaks into the
next run.

Timed, in this order on one copy:

- ``search_runs``: ``MlflowClient.search_runs`` over the experiment, in this process, warm (median of 3): the base;
- ``search_runs, fresh python``: the same call in a new interpreter, so a command's own start cost can be read off;
- ``register: ranking``: ``apps.registry.comparable``, what ``make register`` reads and ranks, in this process;
- ``make register TASK=task1``: as typed, a subprocess on the copy (ranking, packaging the pyfunc, the alias);
- ``compare: runs + predictions``: ``apps.compare`` resolving two run ids and reading their predictions;
- ``make compare RUNS="<a> <b>"``: as typed (10,000 paired resamples over the test set, then the comparison run);
- ``Headline view: REST``: the calls MLflow 3.17's runs table makes for the *Headline metrics* saved view
  (``experiments/get``, then ``runs/search`` ordered by the view's ``orderByKey``, 100 runs a page as the UI asks,
  every page as *Load more* would), against ``mlflow ui`` on a free port, started and stopped here.

Run: ``.venv/bin/python tests/bench/bench_store.py [--runs 300] [--test-rows 2000]`` (or ``make bench-store``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

#: Bump when what a filled store holds changes, so a stale cache is not reused.
VERSION = "store-v1"
CACHE = Path(os.environ.get("CXRLT_BENCH_STORE_CACHE", "/tmp/cxrlt-bench-store"))
PAGE = 100  # MLflow 3.17's runs table asks for 100 runs a page (its bundle's SEARCH_MAX_RESULTS)
EPOCHS = 8  # configs/trainer/default.yaml max_epochs
STEPS_PER_EPOCH = 1100  # ~140k training images at batch size 128
SYSTEM_SAMPLES = 60  # system metrics, every tracking.system_metrics.interval_s (10 s) of a short run
SYSTEM_KEYS = ("system/cpu_utilization_percentage", "system/system_memory_usage_megabytes",
               "system/system_memory_usage_percentage", "system/disk_usage_percentage",
               "system/disk_usage_megabytes", "system/disk_available_megabytes", "system/network_receive_megabytes",
               "system/network_transmit_megabytes")  # fmt: skip
SOURCES = ("padchest", "nih")
GROUPS = ("head", "medium", "tail")


# --- what a default Task 1 run logs ------------------------------------------------------------------------------


def task1_config(root: Path):
    """The composed default Task 1 config (no debug preset), as training would log it."""
    from hydra import compose, initialize_config_dir

    from training.config_files import CONFIGS

    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        return compose("train", overrides=["task=task1", f"data.source.root={root}", "model.pretrained=false"])


def run_params(cfg) -> dict[str, str]:
    """The params a run logs (``training.tracking.session.flatten``), unresolved where resolving needs a machine."""
    from omegaconf import OmegaConf

    from training.tracking.session import flatten

    try:
        return flatten(cfg)
    except Exception:  # an interpolation that needs the data or the device: the unresolved text has the same shape
        plain = OmegaConf.to_container(cfg, resolve=False)
        plain.pop("hydra", None)
        return _walk(plain)


def _walk(node, prefix: str = "", out: dict | None = None) -> dict[str, str]:
    out = {} if out is None else out
    if isinstance(node, dict):
        for key, value in node.items():
            _walk(value, f"{prefix}{key}.", out)
    else:
        out[prefix[:-1]] = str(node)
    return out


def test_phase_template(labels: list[str], rows: int, seed: int = 0) -> dict[str, float]:
    """One default test phase's metric keys and plausible values: ``compute_suite`` on a synthetic test set for
    each metric set, kept as ``evaluation.evaluate`` and ``evaluation.heldout`` keep them."""
    from evaluation.evaluate import MACROS, _prefixed
    from evaluation.metrics import prevalence_baseline_map
    from evaluation.suite import compute_suite

    rng = np.random.default_rng(seed)
    targets, probs = synthetic_test_set(labels, rows, rng)
    c = len(labels)
    groups = {name: list(part) for name, part in zip(GROUPS, np.array_split(np.arange(c), 3), strict=True)}
    suite = dict(labels=labels, n_boot=100, seed=0, threshold=0.5, class_groups=groups)
    val_thresholds = np.full(c, 0.4)
    metrics: dict[str, float] = {}
    for prefix, macros_only in (("test", False), ("test_tta", True), ("test_perturbed", True), ("heldout", True)):
        noisy = np.clip(probs + rng.normal(0, 0.05, probs.shape), 0, 1)
        result = compute_suite(targets, noisy, val_thresholds=val_thresholds, **suite)
        metrics.update(_prefixed(prefix, result.metrics, macros_only))
    for macro in MACROS:
        if f"test_perturbed/{macro}" in metrics and f"test/{macro}" in metrics:
            metrics[f"test_perturbed/delta/{macro}"] = metrics[f"test_perturbed/{macro}"] - metrics[f"test/{macro}"]
    halves = np.array_split(np.arange(rows), len(SOURCES))
    for name, index in zip(SOURCES, halves, strict=True):
        result = compute_suite(targets[index], probs[index], **{**suite, "class_groups": None})
        for prefix in ("test/source", "heldout/source"):
            metrics.update({f"{prefix}/{name}/{k}": v for k, v in result.metrics.items()
                            if k.split("_ci_")[0] in MACROS and np.isfinite(v)})  # fmt: skip
    metrics["test/prevalence_baseline_mAP"] = prevalence_baseline_map(targets)
    metrics["heldout/n_images"] = 300.0
    metrics["heldout/trained_on"] = 1.0
    return metrics


def synthetic_test_set(labels: list[str], rows: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """Long-tailed targets (prevalence 30% down to 0.5%) and scores that know something about them."""
    prevalence = np.geomspace(0.3, 0.005, len(labels))
    targets = (rng.random((rows, len(labels))) < prevalence).astype(int)
    probs = np.clip(targets * 0.35 + rng.random(targets.shape) * 0.65, 0, 1)
    return targets, probs


def history(rng, best: float) -> list:
    """The per-epoch training and validation metrics and the system metrics of one run, as ``Metric`` rows."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    rows = []
    for epoch in range(EPOCHS):
        step = (epoch + 1) * STEPS_PER_EPOCH
        val = best * (0.6 + 0.4 * (epoch + 1) / EPOCHS)
        values = {"train/loss": 0.3 / (epoch + 1), "train/lr": 1e-3 * (1 - epoch / EPOCHS), "epoch": epoch,
                  "val/mAP": val, "val/mAUROC": 0.5 + val / 2,
                  **{f"val/group/{g}/mAP": val * s for g, s in zip(GROUPS, (1.3, 1.0, 0.6), strict=True)}}  # fmt: skip
        rows += [Metric(key, float(value), now + step, step) for key, value in values.items()]
    for sample in range(SYSTEM_SAMPLES):
        rows += [Metric(key, float(rng.random() * 100), now + sample * 10_000, sample) for key in SYSTEM_KEYS]
    return rows


def predictions_frame(labels: list[str], targets: np.ndarray, probs: np.ndarray) -> pd.DataFrame:
    """A run's ``predictions/test.csv`` (``evaluation.prediction_columns``): ids, source, scores, true labels."""
    rows = len(targets)
    meta = pd.DataFrame({"image_id": [f"img{i:06d}" for i in range(rows)],
                         "patient_id": [f"p{i // 2:06d}" for i in range(rows)],
                         "source": np.where(np.arange(rows) < rows // 2, SOURCES[0], SOURCES[1])})  # fmt: skip
    scores = pd.DataFrame(probs, columns=labels)
    truth = pd.DataFrame(targets, columns=[f"true/{name}" for name in labels])
    return pd.concat([meta, scores, truth], axis=1)


def per_class_json(labels: list[str], path: Path) -> Path:
    """A minimal ``evaluation/per_class.json`` (class and group), what ``make compare`` reads the groups from."""
    from evaluation.tables import write_table

    group = [g for g, part in zip(GROUPS, np.array_split(np.arange(len(labels)), 3), strict=True) for _ in part]
    return write_table(pd.DataFrame({"class": labels, "group": group}), path)


# --- filling and copying the store --------------------------------------------------------------------------------


def fill(folder: Path, runs: int, test_rows: int, compared: int = 2) -> dict:
    """Fill a store of ``runs`` finished runs under ``folder``; returns what the timings need (see module doc)."""
    from mlflow.entities import Metric, Param, RunTag

    from evaluation.tables import headline_view_tag, logged_tables_tag
    from tests.finished_runs import fabricate_finished_run
    from training.tracking.run_context import DEBUG_TAG, VAL_FINGERPRINT_TAG, mark_model_training

    folder.mkdir(parents=True)
    started = time.perf_counter()
    client, champion, _ = fabricate_finished_run(folder)
    experiment = client.get_run(champion).info.experiment_id
    mark_model_training(client, experiment, headline_view_tag("val/mAP"))
    # make compare logs into compare-task1; made here so its artifacts stay inside the store's folder
    client.create_experiment("compare-task1", artifact_location=(folder / "artifacts-compare").as_uri())
    cfg = task1_config(folder / "synthetic")
    labels = list(cfg.task.labels)
    params = run_params(cfg)
    template = test_phase_template(labels, test_rows)
    rng = np.random.default_rng(2026)
    targets, base_probs = synthetic_test_set(labels, test_rows, rng)
    per_class = per_class_json(labels, folder / "per_class.json")
    ids = [champion]
    for _ in range(runs - 1):
        ids.append(client.create_run(experiment).info.run_id)
    bests = rng.uniform(0.20, 0.30, runs)
    bests[0] = 0.35  # the fabricated run (config + weights) is the one make register picks
    for index, run_id in enumerate(ids):
        loss = ("bce", "asl", "focal", "ldam")[index % 4]
        now = int(time.time() * 1000)
        metrics = [Metric(k, float(v + rng.normal(0, 0.01)), now, 0) for k, v in template.items()]
        metrics += [Metric("val/mAP_best", float(bests[index]), now, 0), Metric("best_epoch", 5.0, now, 0)]
        metrics += history(rng, float(bests[index]))
        run_params_ = {**params, "loss.name": loss, "seed": str(index)}
        tags = {"task": "task1", VAL_FINGERPRINT_TAG: "abcdef012345", DEBUG_TAG: "false",
                "mlflow.runName": f"convnext-{loss}-s{index}",
                "mlflow.note.content": f"task1: convnext with {loss} loss and random sampling, seed {index}.",
                "mlflow.source.git.commit": "0" * 40, "cxrlt.run_key": f"{index:012x}",
                **logged_tables_tag(["evaluation/per_class.json"])}  # fmt: skip
        client.log_batch(run_id, metrics=metrics, params=[Param(k, v[:6000]) for k, v in run_params_.items()],
                         tags=[RunTag(k, v) for k, v in tags.items()])  # fmt: skip
        if index <= compared:  # the champion and the compared runs hold test predictions
            probs = np.clip(base_probs + rng.normal(0, 0.05, base_probs.shape), 0, 1)
            csv = folder / "test.csv"
            predictions_frame(labels, targets, probs).to_csv(csv, index=False)
            client.log_artifact(run_id, str(csv), "predictions")
            client.log_artifact(run_id, str(per_class), "evaluation")
        client.set_terminated(run_id, "FINISHED")
        if (index + 1) % 50 == 0:
            print(f"  filled {index + 1}/{runs} runs ({time.perf_counter() - started:.0f} s)", flush=True)
    meta = {"version": VERSION, "runs": runs, "test_rows": test_rows, "experiment": experiment,
            "champion": champion, "compared": ids[1:compared + 1], "metrics_per_run": len(template) + 2,
            "history_rows_per_run": len(history(rng, 0.3)), "params_per_run": len(params),
            "fill_s": time.perf_counter() - started, "folder": str(folder)}  # fmt: skip
    (folder / "meta.json").write_text(json.dumps(meta, indent=1))
    return meta


def cached_store(runs: int, test_rows: int) -> tuple[Path, dict]:
    """The filled store for these sizes, filled once per ``VERSION`` (a half-filled folder is refilled)."""
    folder = CACHE / f"{VERSION}-{runs}runs-{test_rows}rows"
    meta = folder / "meta.json"
    if meta.is_file():
        return folder, json.loads(meta.read_text())
    shutil.rmtree(folder, ignore_errors=True)
    print(f"filling {folder} with {runs} runs (once per version; later runs reuse it)", flush=True)
    return folder, fill(folder, runs, test_rows)


def working_copy(source: Path, target: Path) -> str:
    """A copy of the store whose runs and experiments point at the copy's artifacts; returns its tracking URI."""
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target)
    old, new = source.as_uri(), target.as_uri()
    with sqlite3.connect(target / "mlflow.db") as db:
        db.execute("UPDATE experiments SET artifact_location = replace(artifact_location, ?, ?)", (old, new))
        db.execute("UPDATE runs SET artifact_uri = replace(artifact_uri, ?, ?)", (old, new))
    return f"sqlite:///{target}/mlflow.db"


# --- timings ------------------------------------------------------------------------------------------------------


def timed(fn, repeats: int = 1) -> float:
    """Median wall time of ``repeats`` calls, in seconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def shell(command: list[str], uri: str, cwd: Path = ROOT) -> float:
    """Wall time of ``command`` run as a user would, on the store at ``uri``; its output shown when it fails."""
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        tail = f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{tail}")
    return seconds


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.loads(response.read())


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=300) as response:
        return json.loads(response.read())


def headline_view(base: str, experiment: str) -> tuple[int, int]:
    """The REST calls of the runs table opening the *Headline metrics* view and loading every page; returns
    ``(runs, bytes of the run pages)``."""
    from evaluation.tables import HEADLINE_VIEW_ID, SAVED_VIEW_PREFIX

    found = get(f"{base}/ajax-api/2.0/mlflow/experiments/get?experiment_id={experiment}")
    tags = {t["key"]: t["value"] for t in found["experiment"].get("tags", [])}
    state = json.loads(json.loads(tags[SAVED_VIEW_PREFIX + HEADLINE_VIEW_ID])["state"])
    order = [f"{state['orderByKey']} {'ASC' if state['orderByAsc'] else 'DESC'}"]
    runs, size, token = 0, 0, None
    while True:
        body = {"experiment_ids": [experiment], "run_view_type": "ACTIVE_ONLY", "max_results": PAGE, "order_by": order}
        if token:
            body["page_token"] = token
        page = post(f"{base}/ajax-api/2.0/mlflow/runs/search", body)
        runs += len(page.get("runs", []))
        size += len(json.dumps(page))
        token = page.get("next_page_token")
        if not token:
            return runs, size


def start_ui(uri: str, folder: Path) -> tuple[subprocess.Popen, str]:
    """``mlflow ui`` on the store, as ``make ui`` starts it, on a free port; returns it and its base URL."""
    port = free_port()
    log = open(folder / "ui.log", "w")  # noqa: SIM115 - closed with the process
    command = [str(ROOT / ".venv/bin/mlflow"), "ui", "--backend-store-uri", uri, "--host", "127.0.0.1", "--port",
               str(port)]  # fmt: skip
    # its own process group: its uvicorn workers and the job runner's consumers are stopped with it
    server = subprocess.Popen(command, cwd=folder, stdout=log, stderr=log, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        try:
            urllib.request.urlopen(f"{base}/health", timeout=5)
            return server, base
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                stop(server)
                raise SystemExit(f"mlflow ui did not come up: {(folder / 'ui.log').read_text()[-2000:]}") from None
            time.sleep(0.5)


def stop(server: subprocess.Popen) -> None:
    """Stop ``mlflow ui`` and every process it started (uvicorn workers, the job runner's consumers)."""
    try:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    except ProcessLookupError:
        pass


def settle(fn, tries: int = 10) -> None:
    """Call ``fn`` until one call is no slower than 1.2x the one before: ``mlflow ui`` starts four uvicorn workers
    and the job runner's consumers, which take the CPU for a while after ``/health`` first answers."""
    last = timed(fn)
    for _ in range(tries):
        now = timed(fn)
        if now <= 1.2 * last:
            return
        last = now


def bench(runs: int, test_rows: int, repeats: int) -> list[tuple[str, float, str]]:
    from mlflow import MlflowClient

    from apps.compare import read_predictions, resolve_entries
    from apps.registry import comparable

    source, meta = cached_store(runs, test_rows)
    work = CACHE / f"work-{os.getpid()}"
    uri = working_copy(source, work)
    print(f"store: {meta['runs']} finished runs, {meta['metrics_per_run']} metrics each (+{meta['history_rows_per_run']}"
          f" history rows), {meta['params_per_run']} params; test set {meta['test_rows']} x 30; filled in "
          f"{meta['fill_s']:.0f} s; copy {work}", flush=True)  # fmt: skip
    rows: list[tuple[str, float, str]] = []
    try:
        client = MlflowClient(uri)
        experiment = meta["experiment"]
        found = client.search_runs([experiment], max_results=50000)  # warm the engine and the page cache
        assert len(found) == meta["runs"], f"{len(found)} runs in the store, expected {meta['runs']}"
        base = timed(lambda: client.search_runs([experiment], max_results=50000), repeats)
        rows.append(("search_runs (in process, warm; the base)", base, f"{len(found)} runs"))
        fresh = (f"from mlflow import MlflowClient; print(len(MlflowClient({uri!r}).search_runs([{experiment!r}], "
                 "max_results=50000)))")  # fmt: skip
        rows.append(("search_runs, fresh python", shell([sys.executable, "-c", fresh], uri), "import + engine"))
        ranking = comparable(client, "task1", "task1", "val/mAP")
        assert ranking.ranked[0].run_id == meta["champion"], "the fabricated run should rank first"
        rows.append(("register: ranking (apps.registry.comparable)",
                     timed(lambda: comparable(client, "task1", "task1", "val/mAP"), repeats),
                     f"{len(ranking.ranked)} ranked"))  # fmt: skip
        rows.append(("make register TASK=task1", shell(["make", "register", "TASK=task1"], uri), "packages the pyfunc"))
        a, b = meta["compared"]
        rows.append(("compare: runs + predictions (apps.compare)",
                     timed(lambda: read_predictions(client, resolve_entries(client, [a, b])), repeats),
                     f"{test_rows} x 30 each"))  # fmt: skip
        rows.append(('make compare RUNS="<a> <b>"', shell(["make", "compare", f"RUNS={a} {b}"], uri),
                     "10,000 paired resamples"))  # fmt: skip
        server, url = start_ui(uri, work)
        try:
            settle(lambda: headline_view(url, experiment))
            seen: list = []
            seconds = timed(lambda: seen.append(headline_view(url, experiment)), repeats)
            first = timed(lambda: post(f"{url}/ajax-api/2.0/mlflow/runs/search",
                                       {"experiment_ids": [experiment], "max_results": PAGE,
                                        "order_by": ["metrics.`val/mAP_best` DESC"]}), repeats)  # fmt: skip
        finally:
            stop(server)
        rows.append(("Headline view: first page (REST, 100 runs)", first, ""))
        rows.append(("Headline view: every page (REST)", seconds,
                     f"{seen[-1][0]} runs, {seen[-1][1] / 1e6:.1f} MB JSON"))  # fmt: skip
        return [(name, s, f"{s / base:.1f}x", note) for name, s, note in rows]
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv=None) -> None:
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--test-rows", type=int, default=2000, help="test images in the compared runs' predictions")
    parser.add_argument("--repeats", type=int, default=3, help="in-process timings: median of this many")
    args = parser.parse_args(argv)
    table = bench(args.runs, args.test_rows, args.repeats)
    width = max(len(row[0]) for row in table)
    print(f"\n{'operation':<{width}}  {'seconds':>8}  {'ratio':>7}  note")
    for name, seconds, ratio, note in table:
        print(f"{name:<{width}}  {seconds:8.2f}  {ratio:>7}  {note}")


if __name__ == "__main__":
    main()
