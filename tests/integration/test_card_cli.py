"""`make card` end to end on a smoke-trained run reached through the model registry: a card YAML pointing at
generated Kermany- and reader-study-shaped folders, a benchmark the model cannot take, data not configured or
missing; the headline values equal what `make benchmark` alone logs, and the card lands in the run and in the
registered version's description."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pandas as pd
import pytest

from apps.benchmarks.card_cli import CARD_END
from tests.benchmark_data import write_kermany
from tests.conftest import PROJECT_ROOT
from tests.reveal_data import write_reader_folder
from tests.temporal_data import write_followup_folder

pytestmark = pytest.mark.e2e  # trains through the real CLI: make test-e2e (docs/development.md)

N_BOOT = 50


@pytest.fixture(scope="module")
def registered(tmp_path_factory, smoke_champion):
    """The session's smoke run of task1 (no Pneumonia output), registered as cxrlt-task1@champion with a description
    of the user's own, and a folder for the card's files."""
    env, client, run = smoke_champion
    client.update_model_version("cxrlt-task1", "1", description="Smoke run for the card test.")
    return tmp_path_factory.mktemp("card"), env, client, run


def make(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-s", *args], env=env, capture_output=True, text=True, timeout=600,
                          cwd=PROJECT_ROOT)  # fmt: skip


def write_card(tmp: Path) -> Path:
    kermany, reveal, followups = tmp / "kermany", tmp / "reveal", tmp / "followups"
    write_kermany(kermany, train=(140, 380), test=(45, 75))
    write_reader_folder(reveal)
    write_followup_folder(followups)
    path = tmp / "card.yaml"
    path.write_text(f"""
benchmarks:
  pneumonia: {{data: {kermany}, version: n100, metric: auroc, methods: {{zero_shot: outputs, probe: null}},
              floor: {{chance: 0.5}}}}
  reveal: {{data: {reveal}, metric: all/macro/auroc, methods: {{model: outputs}}, floor: {{chance: 0.5}}}}
  chextemporal: {{data: {followups}, metric: accuracy, methods: {{zero_shot: text}}, floor: {{majority: majority}}}}
  imageclef-concepts: {{data: null, metric: f1_primary, methods: {{model: outputs}}, floor: {{prior: prior}}}}
  imageclef-captions: {{data: {tmp / "no-rocov2"}, metric: rouge1, methods: {{nearest: null}}}}
run_metrics:
  - {{key: test/mAP, label: test, floor: {{prevalence: test/prevalence_baseline_mAP}}}}
  - {{key: test_unseen/mAP, label: unseen findings}}
""")
    return path


def test_make_card_runs_each_benchmark_as_make_benchmark_does_and_logs_the_table(registered):
    tmp, env, client, run = registered
    card = write_card(tmp)
    common = f"--n-boot {N_BOOT} --cache-dir {tmp / 'cache'} --artifact-root {tmp / 'artifacts'}"
    done = make(env, "card", "MODEL=models:/cxrlt-task1@champion", f"CARD={card}", f"ARGS={common}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (
        "| benchmark | protocol (version) | method | headline metric | value [95% CI] | floor | note |" in done.stdout
    )

    run_id = run.info.run_id
    folder = Path(client.download_artifacts(run_id, "card", str(tmp / "dl")))
    rows = pd.read_csv(folder / "card.csv", keep_default_na=False)  # "n/a" is a status here, not a missing value
    numbers = ["value", "ci_low", "ci_high"]
    rows[numbers] = rows[numbers].apply(pd.to_numeric, errors="coerce")
    got = {(r.benchmark, r.method): r for r in rows.itertuples()}
    assert list(zip(rows["benchmark"], rows["method"], rows["metric"], strict=True)) == [
        ("pneumonia", "zero_shot", "auroc"),
        ("pneumonia", "probe", "auroc"),
        ("reveal", "model", "all/macro/auroc"),
        ("chextemporal", "zero_shot", "accuracy"),
        ("imageclef-concepts", "", "f1_primary"),
        ("imageclef-captions", "", "rouge1"),
        ("CXR-LT task1", "model", "test/mAP"),
    ]  # no test_unseen/mAP row: a task1 run has no unseen findings
    # n/a rows name what was looked for; not-run rows why.
    assert (
        got["pneumonia", "zero_shot"].status == "n/a" and "no 'Pneumonia' output" in got["pneumonia", "zero_shot"].note
    )
    assert got["chextemporal", "zero_shot"].note == "models:/cxrlt-task1@champion has no text tower to read the prompts"
    assert got["imageclef-concepts", ""].status == "not run" and "data is null" in got["imageclef-concepts", ""].note
    assert got["imageclef-captions", ""].note.startswith(f"data folder {tmp / 'no-rocov2'} does not exist")
    # The chextemporal benchmark was not run at all (nothing the model could take); the two others were, once each.
    names = {e.name for e in client.search_experiments()}
    assert "benchmark-chextemporal" not in names and {"benchmark-pneumonia", "benchmark-reveal"} <= names

    # The reference: make benchmark alone, same settings; its logged headline equals the card's row.
    for name, data, method, metric, version in (("pneumonia", "kermany", "probe", "auroc", "n100"),
                                                ("reveal", "reveal", "model", "all/macro/auroc", "all")):  # fmt: skip
        alone = make(env, "benchmark", f"NAME={name}", "MODEL=models:/cxrlt-task1@champion", f"DATA_ROOT={tmp / data}",
                     f"VERSION={version}", f"ARGS={common} --experiment reference-{name}")  # fmt: skip
        assert alone.returncode == 0, alone.stdout[-3000:] + alone.stderr[-3000:]
        (reference,) = client.search_runs([client.get_experiment_by_name(f"reference-{name}").experiment_id])
        row, logged = got[name, method], reference.data.metrics
        assert row.status == "ok" and row.metric == metric
        assert (row.value, row.ci_low, row.ci_high) == pytest.approx(
            (logged[f"{method}/{metric}"], logged[f"{method}/{metric}_ci_low"], logged[f"{method}/{metric}_ci_high"])
        )
        assert row.protocol == f"{name} {version} (test {reference.data.params['test_fingerprint']})"
    assert got["pneumonia", "probe"].floor == "chance 0.500"

    metrics = client.get_run(run_id).data.metrics
    cxrlt = got["CXR-LT task1", "model"]
    assert cxrlt.value == pytest.approx(metrics["test/mAP"]) and cxrlt.ci_low == pytest.approx(
        metrics["test/mAP_ci_low"]
    )
    assert cxrlt.floor == f"prevalence {metrics['test/prevalence_baseline_mAP']:.3f}"

    markdown, page = (folder / "card.md").read_text(), (folder / "card.html").read_text()
    assert markdown.startswith(f"# Model card: models:/cxrlt-task1@champion, run {run_id} (task task1)\n")
    assert markdown.count("\n| ") == 1 + len(rows) and page.count("<tr") == 1 + len(rows)
    assert "<" not in markdown and "pneumonia `" in markdown and "in `benchmark-pneumonia`" in markdown
    description = client.get_model_version("cxrlt-task1", "1").description
    # MLflow's version list shows a description's start: the card's title, then the user's own text after it
    assert description.startswith(f"# Model card: models:/cxrlt-task1@champion, run {run_id} (task task1)\n")
    assert description.endswith(f"{CARD_END}\n\nSmoke run for the card test.")
    assert "| pneumonia | pneumonia n100 (test " in description


def test_make_card_bad_input_is_one_line_without_a_traceback(registered, tmp_path):
    _, env, _, run = registered
    bad_card = tmp_path / "card.yaml"
    bad_card.write_text("benchmarks:\n  pneumonia: {data: null, metric: auc, methods: {probe: null}}\n")
    for args, message in (
        ((), "make card: MODEL (--model) is required; usage: make card MODEL="),
        (("MODEL=deadbeef",), "make card: model 'deadbeef': no run 'deadbeef' in sqlite:///"),
        (("MODEL=models:/cxrlt-task1@nope",), "make card: models:/cxrlt-task1@nope: no such registered model version"),
        (("MODEL=clip:ViT-B-32",), "make card: 'clip:ViT-B-32' has no run to hold the card"),
        ((f"MODEL={run.info.run_id}", f"CARD={bad_card}"),
         f"make card: {bad_card}: benchmarks.pneumonia.metric: 'auc' is not a metric of pneumonia"),
    ):  # fmt: skip
        done = make(env, "card", *args)
        assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
        assert message in done.stderr
