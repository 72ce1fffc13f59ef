"""The model card's pieces: its YAML checked against the protocols it names, which methods a model can take, the
rows read from a benchmark's table and from the model's own run (untrusted values), the markdown / HTML tables and
the registered version's description."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from apps.benchmarks.card import (
    DEFAULT_CARD,
    CardResult,
    Entry,
    Row,
    data_problem,
    load_card,
    na_rows,
    render_html,
    render_markdown,
    result_rows,
    run_metric_rows,
    unmet,
)
from apps.benchmarks.card_cli import CARD_END, LEGACY_START, with_card
from apps.benchmarks.framework.catalog import available
from apps.benchmarks.framework.encoders import Encoded, Encoder, Target
from apps.benchmarks.framework.protocol import BadInput
from apps.benchmarks.framework.runner import TABLE_COLUMNS


class FakeEncoder(Encoder):
    """An encoder whose zero-shot answers and text tower are set by the test."""

    image_size = 8

    def __init__(self, targets, missing=(), text=False):
        super().__init__("fake-model", targets)
        self.zero_shot_notes = {label: f"fake-model has no {label!r} output" for label in missing}
        self.embed_texts = (lambda texts: np.zeros((len(texts), 2))) if text else None

    @property
    def identity(self) -> str:
        return "fake"

    def encode(self, images):
        return Encoded(np.zeros((len(images), 2), np.float32))


def write_card(tmp_path, text: str):
    path = tmp_path / "card.yaml"
    path.write_text(text)
    return path


PNEUMONIA = (
    "benchmarks:\n  pneumonia:\n    data: null\n    metric: auroc\n    methods: {zero_shot: outputs, probe: null}\n"
)


def test_the_shipped_card_covers_every_benchmark_plug_in_and_the_cxrlt_rows():
    card = load_card(DEFAULT_CARD)
    assert [e.name for e in card.entries] == ["pneumonia", "reveal", "nih-grounding", "chextemporal",
                                              "imageclef-concepts", "imageclef-captions"]  # fmt: skip
    assert {e.name for e in card.entries} == set(available())
    grounding = next(e for e in card.entries if e.name == "nih-grounding")
    assert grounding.metric == "pg/overall" and grounding.floor == {"centre prior": "centre", "random maps": "random"}
    keys = [m.key for m in card.run_metrics]
    assert keys[0] == "test/mAP" and {"test_perturbed/mAP", "heldout/mAP", "test_unseen/external/mAP"} <= set(keys)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("benchmarks:\n  pneumonai: {data: null, metric: auroc, methods: {probe: null}}\n",
         "benchmarks.pneumonai: unknown benchmark 'pneumonai'"),
        (PNEUMONIA.replace("metric: auroc", "metric: auc"),
         "benchmarks.pneumonia.metric: 'auc' is not a metric of pneumonia (known: auroc, accuracy"),
        (PNEUMONIA.replace("metric: auroc", "metric: [auroc]"),
         "benchmarks.pneumonia.metric: ['auroc'] is not a metric of pneumonia"),
        (PNEUMONIA.replace("probe: null", "linear: null"),
         "benchmarks.pneumonia.methods: 'linear' is not a method of pneumonia (known: zero_shot, probe, always_pneumonia,"),
        (PNEUMONIA.replace("probe: null", "probe: weights"),
         "benchmarks.pneumonia.methods.probe: requirement 'weights' is not null, outputs or text"),
        (PNEUMONIA + "    version: n50\n", "benchmarks.pneumonia.version: 'n50' is not a version of pneumonia"),
        (PNEUMONIA + "    floor: {chance: coin}\n", "benchmarks.pneumonia.floor.chance: 'coin' is not a method"),
        (PNEUMONIA + "    data_root: /x\n", "benchmarks.pneumonia: unknown key(s) ['data_root']"),
        (PNEUMONIA + "run_metrics:\n  - {label: test}\n", "run_metrics[0]: expected {key: <metric key>"),
        (PNEUMONIA + "run_metrics:\n  - {key: k, label: l, floor: k2}\n", "run_metrics[0]: expected {key: <metric key>"),
    ],
)  # fmt: skip
def test_a_mistyped_card_names_its_file_and_field(tmp_path, text, message):
    path = write_card(tmp_path, text)
    with pytest.raises(BadInput) as error:
        load_card(path)
    assert str(error.value).startswith(f"{path}: ") and message in str(error.value)


def test_a_missing_card_file_is_named(tmp_path):
    with pytest.raises(BadInput, match=r"card config .*nowhere\.yaml does not exist"):
        load_card(tmp_path / "nowhere.yaml")


def test_data_not_configured_or_not_on_disk_says_which_field(tmp_path):
    card = tmp_path / "card.yaml"
    entry = Entry("pneumonia", None, None, "auroc", {"probe": None}, {})
    assert data_problem(entry, card) == f"no data configured (benchmarks.pneumonia.data is null in {card})"
    gone = Entry("pneumonia", str(tmp_path / "gone"), None, "auroc", {"probe": None}, {})
    assert (
        data_problem(gone, card)
        == f"data folder {tmp_path / 'gone'} does not exist (benchmarks.pneumonia.data in {card})"
    )
    there = Entry("pneumonia", str(tmp_path), None, "auroc", {"probe": None}, {})
    assert data_problem(there, card) is None


def test_methods_the_model_cannot_take_carry_what_was_looked_for():
    entry = Entry("chextemporal", "/x", None, "accuracy", {"zero_shot": "text", "rule": "outputs", "head": None}, {})
    one = [Target("Pneumonia", "p", "n")]
    blind = FakeEncoder(one, missing=["Pneumonia"])
    assert unmet(entry, blind) == {"zero_shot": "fake-model has no text tower to read the prompts",
                                   "rule": "fake-model has no 'Pneumonia' output"}  # fmt: skip
    assert unmet(entry, FakeEncoder(one, text=True)) == {}
    many = [Target(f"C{i:07d}", "p", "n") for i in range(8)]
    reason = unmet(entry, FakeEncoder(many, missing=[t.label for t in many], text=True))["rule"]
    assert reason.startswith("the model answers none of the 8 findings asked about ('C0000000', 'C0000001'")
    assert "..." in reason and "e.g. fake-model has no 'C0000000' output" in reason
    assert unmet(entry, FakeEncoder(many, missing=["C0000000"], text=True)) == {}  # some answered: it takes the rule


def table(rows):
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


def test_rows_take_the_headline_value_and_interval_and_the_floor_from_the_benchmark_table():
    entry = Entry("nih-grounding", "/x", None, "pg/overall", {"model": "outputs"},
                  {"centre prior": "centre", "random maps": "random", "chance": 0.5})  # fmt: skip
    scores = table([("model", "pg/overall", 0.061, 0.056, 0.066), ("centre", "pg/overall", 0.215, 0.19, 0.24),
                    ("random", "pg/overall", np.nan, np.nan, np.nan), ("model", "cnr/overall", 0.1, 0.08, 0.12)])  # fmt: skip
    (row,) = result_rows(entry, scores, "nih-grounding all (test abc)", {}, "run1")
    assert (row.method, row.metric, row.status) == ("model", "pg/overall", "ok")
    assert (row.value, row.ci_low, row.ci_high) == (0.061, 0.056, 0.066)
    assert row.floor == "centre prior 0.215; random maps n/a; chance 0.500"


def test_a_method_without_a_value_or_that_the_model_cannot_take_is_na_with_the_reason():
    entry = Entry("pneumonia", "/x", None, "auroc", {"zero_shot": "outputs", "probe": None}, {"chance": 0.5})
    scores = table([("zero_shot", "auroc", np.nan, np.nan, np.nan), ("probe", "auroc", 0.9, 0.85, 0.95)])
    zero_shot, probe = result_rows(entry, scores, "pneumonia full", {"zero_shot": "no 'Pneumonia' output"}, "run1")
    assert (zero_shot.status, zero_shot.note) == ("n/a", "no 'Pneumonia' output") and math.isnan(zero_shot.value)
    assert probe.status == "ok" and probe.value == 0.9 and probe.floor == "chance 0.500"
    (undefined, _) = result_rows(entry, scores, "pneumonia full", {}, "run1")
    assert undefined.status == "n/a" and "benchmark run run1" in undefined.note
    assert [r.method for r in na_rows(entry, "p", {"probe": "why"})] == ["probe"]


def test_cxrlt_rows_come_only_for_the_keys_the_run_has_and_untrusted_values_become_na():
    card = load_card(DEFAULT_CARD)
    metrics = {"test/mAP": 0.130, "test/mAP_ci_low": 0.125, "test/mAP_ci_high": 0.192,
               "test/prevalence_baseline_mAP": 0.082, "test_perturbed/mAP": 0.123,
               "heldout/mAP": float("inf"), "test_unseen/external/mAP": 0.4,
               "test_unseen_random/external/mAP": "0.2"}  # fmt: skip
    rows = {row.metric: row for row in run_metric_rows(card.run_metrics, metrics, "nih14")}
    assert list(rows) == ["test/mAP", "test_perturbed/mAP", "heldout/mAP", "test_unseen/external/mAP"]
    test = rows["test/mAP"]
    assert (test.benchmark, test.protocol, test.value, test.ci_low, test.ci_high) == (
        "CXR-LT nih14", "the run's test", 0.130, 0.125, 0.192)  # fmt: skip
    assert test.floor == "prevalence 0.082" and rows["test_perturbed/mAP"].floor == "prevalence 0.082"
    assert test.below_floor == "" and test.note == ""
    assert math.isnan(rows["test_perturbed/mAP"].ci_low)
    assert rows["heldout/mAP"].status == "n/a" and "non-finite heldout/mAP" in rows["heldout/mAP"].note
    assert rows["heldout/mAP"].floor == ""  # its floor key is absent
    assert rows["test_unseen/external/mAP"].floor == "random scores 0.200"  # a number read back as text


def test_markdown_and_html_escape_text_read_back_from_a_run():
    rows = [Row("CXR-LT x|y", "the run's test", "model", "test/mAP", 0.5, 0.4, 0.6, "prevalence 0.100"),
            Row("reveal", "reveal all", "model", "all/macro/auroc", status="n/a",
                note="run has no 'a|b' output <script>alert(1)</script> " + "x" * 300)]  # fmt: skip
    result = CardResult("m", rows, {"reveal": "r1"}, {"reveal": "benchmark-reveal"})
    markdown = render_markdown(result, "Model card: m")
    lines = markdown.splitlines()
    assert lines[0] == "# Model card: m"
    assert lines[2] == "| benchmark | protocol (version) | method | headline metric | value [95% CI] | floor | note |"
    assert (
        lines[4] == "| CXR-LT x\\|y | the run's test | model | test/mAP | 0.500 [0.400, 0.600] | prevalence 0.100 |  |"
    )
    assert lines[5].startswith("| reveal | reveal all | model | all/macro/auroc | n/a |  | run has no 'a\\|b' output "
                               "&lt;script&gt;alert(1)&lt;/script&gt;")  # fmt: skip
    assert all(line.count("|") - line.count("\\|") == 8 for line in lines[2:6])  # every row has the 7 columns
    assert "Benchmark runs: reveal `r1` in `benchmark-reveal`." in markdown
    short = render_markdown(result, "t", note_limit=40).splitlines()[5]
    assert short.endswith("... |") and len(short) < 150
    page = render_html(result, "Model card: m")
    assert "<script>" not in page and "&lt;script&gt;" in page and page.count("<tr") == 3
    assert '<tr class="na">' in page and "<td>0.500 [0.400, 0.600]</td>" in page


def test_no_text_in_angle_brackets_reaches_the_markdown_raw():
    """A markdown renderer (MLflow's description) takes ``<name>`` for an HTML tag and drops it: the card's
    markdown has no raw ``<``, whatever the notes hold, and names each benchmark run's real experiment."""
    rows = [Row("pneumonia", "p", "probe", "auroc", status="not run", note="usage: make card MODEL=<run id>")]
    markdown = render_markdown(CardResult("m", rows, {"nih-grounding": "r2"}, {"nih-grounding": "benchmark-x"}), "t")
    assert "<" not in markdown and ">" not in markdown
    assert "MODEL=&lt;run id&gt;" in markdown and "nih-grounding `r2` in `benchmark-x`" in markdown


def test_a_result_below_a_floor_is_flagged_in_the_markdown_csv_and_html():
    entry = Entry("nih-grounding", "/x", None, "pg/overall", {"model": "outputs"},
                  {"centre prior": "centre", "random maps": "random"})  # fmt: skip
    scores = table([("model", "pg/overall", 0.069, 0.063, 0.075), ("centre", "pg/overall", 0.212, 0.19, 0.24),
                    ("random", "pg/overall", 0.070, 0.06, 0.08)])  # fmt: skip
    (row,) = result_rows(entry, scores, "nih-grounding all", {}, "run1")
    assert row.below_floor == "centre prior; random maps"
    above = table([("model", "pg/overall", 0.3, 0.2, 0.4), ("centre", "pg/overall", 0.212, 0.19, 0.24),
                   ("random", "pg/overall", np.nan, np.nan, np.nan)])  # fmt: skip
    assert result_rows(entry, above, "nih-grounding all", {}, "run1")[0].below_floor == ""
    result = CardResult("m", [row])
    assert "| 0.069 [0.063, 0.075] below floor: centre prior; random maps |" in render_markdown(result, "t")
    assert result.frame()["below_floor"].tolist() == ["centre prior; random maps"]
    assert '<tr class="below-floor">' in render_html(result, "t")
    metrics = {"test/mAP": 0.05, "test/prevalence_baseline_mAP": 0.063}
    (cxrlt,) = run_metric_rows(load_card(DEFAULT_CARD).run_metrics[:1], metrics, "task1")
    assert cxrlt.below_floor == "prevalence"


def test_the_held_out_row_keeps_the_runs_seen_in_training_caveat():
    from evaluation.report import TRAINED_ON_CAVEAT

    card = load_card(DEFAULT_CARD)
    metrics = {"heldout/mAP": 0.087, "heldout/trained_on": 1.0}
    (row,) = run_metric_rows(card.run_metrics, metrics, "task1")
    assert row.metric == "heldout/mAP" and row.note == TRAINED_ON_CAVEAT
    (clean,) = run_metric_rows(card.run_metrics, {**metrics, "heldout/trained_on": 0.0}, "task1")
    assert clean.note == ""
    assert TRAINED_ON_CAVEAT in render_markdown(CardResult("m", [row]), "t")


def test_a_new_card_opens_the_description_and_replaces_the_old_one_keeping_the_rest():
    """MLflow's version list shows the start of a description: the card's title, never a marker."""
    first = with_card("Trained by the nightly job.", "# Model card: m, run r (task t)\n| a |\n")
    assert first == f"# Model card: m, run r (task t)\n| a |\n{CARD_END}\n\nTrained by the nightly job."
    second = with_card(first, "# Model card: m, run r (task t)\n| b |")
    assert second.count(CARD_END) == 1 and "| a |" not in second and "| b |" in second
    assert second.startswith("# Model card: m") and second.endswith("Trained by the nightly job.")
    legacy = f"Notes.\n\n{LEGACY_START}\n# Model card: old\n{CARD_END}"
    assert with_card(legacy, "# Model card: new") == f"# Model card: new\n{CARD_END}\n\nNotes."
    assert with_card(None, "# Model card: c") == f"# Model card: c\n{CARD_END}"


LIGHT = {"torch", "mlflow", "pandas", "hydra", "sklearn"}


@pytest.mark.parametrize(
    ("args", "message", "not_loaded"),
    [([], "make card: MODEL (--model) is required; usage: make card MODEL=", LIGHT),
     (["--model", "clip:ViT-B-32"], "make card: 'clip:ViT-B-32' has no run to hold the card", LIGHT),
     (["--model", "deadbeef"], "make card: model 'deadbeef': no run 'deadbeef' in sqlite:///", {"torch", "sklearn"})],
)  # fmt: skip
def test_make_card_without_a_usable_model_answers_before_torch_loads(args, message, not_loaded, tmp_path):
    """The command itself (``python -m``, as make runs it), with Python's import log: nothing heavy is imported
    before the one-line answer (a run id needs the store, so mlflow, but never torch)."""
    import os
    import subprocess
    import sys

    from tests.conftest import PROJECT_ROOT

    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db"}
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "apps.benchmarks.card_cli", *args], env=env,
                          capture_output=True, text=True, timeout=120, cwd=PROJECT_ROOT)  # fmt: skip
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr
    imported = {line.split("|")[-1].strip().split(".")[0] for line in done.stderr.splitlines() if "|" in line}
    assert "apps" in imported and not imported & not_loaded


def test_a_cxrlt_row_says_which_classes_its_estimate_and_resamples_leave_out_and_the_rule_is_under_the_table():
    """An estimate outside its own interval (0.085 [0.090, 0.125]) follows from the drop-class rule: the row says
    how many classes are left out, and the card states the rule once, in markdown and HTML alike."""
    from evaluation.intervals import CI_RULE

    labels = [f"c{k}" for k in range(28)]  # 28 classes enter the mean, 2 are left out
    metrics = {"test/mAP": 0.085, "test/mAP_ci_low": 0.090, "test/mAP_ci_high": 0.125,
               "test/mAP_classes_left_out": 2.0, "test/mAP_resamples_dropping_a_class": 412.0,
               **{f"test/ap/{label}": 0.1 for label in labels}}  # fmt: skip
    (row,) = run_metric_rows(load_card(DEFAULT_CARD).run_metrics[:1], metrics, "task1")
    assert "2 of 30 classes have no positive in test and are left out" in row.note
    assert "412 resamples lost a further class" in row.note
    markdown = render_markdown(CardResult("m", [row]), "t")
    assert markdown.rstrip().endswith(f"CXR-LT rows: {CI_RULE}")
    assert f"CXR-LT rows: {CI_RULE}" in render_html(CardResult("m", [row]), "t")
    (plain,) = run_metric_rows(load_card(DEFAULT_CARD).run_metrics[:1], {"test/mAP": 0.1}, "task1")
    assert plain.note == "" and "CXR-LT rows:" not in render_markdown(CardResult("m", [plain]), "t")
