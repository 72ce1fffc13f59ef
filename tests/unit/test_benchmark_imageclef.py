"""ImageCLEF concept detection and caption prediction as benchmark plug-ins, on a tiny ROCOv2-shaped release: the
concepts asked about, the frequency-prior and most-common-caption floors against hand-computed scores, and both
through the command line into MLflow."""

from __future__ import annotations

from collections import Counter
from importlib.util import find_spec

import numpy as np
import pytest
from mlflow import MlflowClient

from apps.benchmarks import cli
from apps.benchmarks.framework.catalog import load_protocol
from apps.benchmarks.framework.extra import INSTALL
from apps.benchmarks.framework.protocol import BadInput
from apps.benchmarks.framework.report import render_report
from apps.benchmarks.framework.runner import draw_subsets, load_model, run_benchmark
from apps.benchmarks.imageclef_captions.scoring import preprocess, rouge1_f
from tests.benchmark_data import write_tiny_clip
from tests.imageclef_data import ABDOMEN, CHEST, MODALITY, NODULE, caption_of, concepts_of, write_rocov2

#: The captions benchmark scores with the benchmarks extra's packages.
captions_metrics = pytest.mark.skipif(find_spec("rouge_score") is None, reason=INSTALL)


def run(name, root, spec, n_boot=40):
    protocol = load_protocol(name)
    draw = draw_subsets(protocol, root)
    return run_benchmark(protocol, draw, load_model(protocol, spec, "sqlite:///unused.db"), root, n_boot=n_boot,
                         cache_dir=None, batch_size=16)  # fmt: skip


def set_f1(true: set, predicted: set) -> float:
    """F1 of two sets: 2|P & T| / (|P| + |T|) (0 when nothing is shared)."""
    return 2 * len(true & predicted) / (len(true) + len(predicted)) if true or predicted else float("nan")


def test_the_concepts_asked_about_are_those_frequent_in_training(tmp_path):
    write_rocov2(tmp_path)
    protocol = load_protocol("imageclef-concepts")
    draw = draw_subsets(protocol, tmp_path)
    # 40 training images: 20 CT, 20 X-ray, 14 abdomen, 26 chest, 8 nodules (< min_count 10)
    assert sorted(t.label for t in protocol.targets) == sorted([MODALITY["ct"], MODALITY["xray"], ABDOMEN, CHEST])
    assert len(draw.test) == 12 and draw.test.targets.concepts[0] == frozenset(concepts_of(0))


def test_the_frequency_prior_scores_what_the_organisers_rules_give_by_hand(tmp_path):
    write_rocov2(tmp_path)
    result = run("imageclef-concepts", tmp_path, write_tiny_clip(tmp_path / "clip"))
    values = result.table.set_index(["protocol", "metric"])["value"]
    prior = set(result.scores["prior_concepts"].iloc[0].split(";"))
    counts = Counter(c for i in range(40) for c in concepts_of(i))
    assert prior <= set(counts) and all(counts[c] >= counts[o] for c in prior for o in set(counts) - prior)
    primary = np.mean([set_f1(set(concepts_of(i)), prior) for i in range(12)])
    manual_vocabulary = {MODALITY["ct"], MODALITY["xray"], ABDOMEN, CHEST}
    secondary = np.mean([set_f1(set(concepts_of(i)) - {NODULE}, prior & manual_vocabulary) for i in range(12)])
    assert values[("prior", "f1_primary")] == pytest.approx(primary)
    assert values[("prior", "f1_secondary")] == pytest.approx(secondary)
    assert 0 <= values[("model", "f1_primary")] <= 1


def test_the_secondary_vocabulary_is_the_2024_tasks_by_default_and_a_wrong_name_is_refused():
    from apps.benchmarks.imageclef_concepts import ConceptProtocol
    from apps.benchmarks.imageclef_concepts.scoring import MANUAL_2024

    assert load_protocol("imageclef-concepts").named == MANUAL_2024
    with pytest.raises(ValueError, match="secondary: no secondary vocabulary '1999'"):
        ConceptProtocol("x", "x", 0, {"rocov2-test": "test"}, {}, 10, "1999", "{name}", "image")


@pytest.mark.parametrize("name", ["imageclef-concepts", pytest.param("imageclef-captions", marks=captions_metrics)])
def test_the_version_is_rocov2s_own_test_split_and_the_report_says_it_is_not_the_2024_test_set(tmp_path, name):
    write_rocov2(tmp_path)
    protocol = load_protocol(name)
    assert protocol.versions == {"rocov2-test": "test", "rocov2-valid": "valid"}
    result = run(name, tmp_path, write_tiny_clip(tmp_path / "clip"), n_boot=0)
    report = render_report(result)
    assert report.startswith(f"# Benchmark {name} (rocov2-test)\n")  # the default version, named for its images
    assert ("- test: ROCOv2's own test split, not the ImageCLEFmedical 2024 test set (17,237 images): the 2024 "
            "leaderboard's scores are on that set and not comparable with these; 12 ") in report  # fmt: skip
    valid = draw_subsets(protocol, tmp_path, "rocov2-valid")
    assert valid.version == "rocov2-valid" and valid.description[0].startswith("test: ROCOv2's own valid split, not")
    with pytest.raises(BadInput, match=f"unknown version 'test' of benchmark {name}; choose one of rocov2-test, "):
        draw_subsets(protocol, tmp_path, "test")


def test_a_release_without_its_images_is_named(tmp_path):
    write_rocov2(tmp_path)
    (tmp_path / "test" / "ROCOv2_2023_test_000003.jpg").unlink()
    with pytest.raises(BadInput, match="1 of 12 test images not found .*ROCOv2_2023_test_000003.jpg"):
        draw_subsets(load_protocol("imageclef-concepts"), tmp_path)


@captions_metrics
def test_the_most_common_caption_floor_and_retrieval(tmp_path):
    write_rocov2(tmp_path)
    result = run("imageclef-captions", tmp_path, write_tiny_clip(tmp_path / "clip"))
    values = result.table.set_index(["protocol", "metric"])["value"]
    constant = result.scores.columns  # the floor's caption is named in the notes
    note = next(n for n in result.notes if n.startswith("nearest caption:"))
    floor = note.split("most common caption: ")[1].strip("'\"")
    assert preprocess(floor) in {preprocess(caption_of(i)) for i in range(40)}
    expected = np.mean([rouge1_f(caption_of(i), floor) for i in range(12)])
    assert values[("constant", "rouge1")] == pytest.approx(expected)
    assert np.isnan(values[("constant", "bertscore")])  # the organisers' DeBERTa is not on this machine
    assert any("bertscore: n/a (" in n and "deberta" in n.lower() for n in result.notes)
    for name in ("meteor", "cider"):  # computed by pycocoevalcap
        assert np.isfinite(values[("constant", name)]) and values[("constant", name)] >= 0
    for name in ("bleurt", "clipscore", "refclipscore", "clinicalbleurt", "medbertscore"):  # need weights: n/a
        assert np.isnan(values[("constant", name)]) and any(n.startswith(f"{name}: n/a (") for n in result.notes)
    assert set(result.scores["nearest"]) <= {caption_of(i) for i in range(40)} and len(constant) > 0


@captions_metrics
def test_both_through_the_command_line_into_mlflow(tmp_path, capsys):
    write_rocov2(tmp_path / "data")
    spec = write_tiny_clip(tmp_path / "clip")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for name in ("imageclef-concepts", "imageclef-captions"):
        argv = ["--name", name, "--model", spec, "--data-root", str(tmp_path / "data"), "--n-boot", "20",
                "--tracking-uri", uri, "--artifact-root", str(tmp_path / "artifacts"), "--no-cache"]  # fmt: skip
        assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "| F1, all concepts (primary) | " in out and "| ROUGE-1 F (secondary) | " in out
    client = MlflowClient(uri)
    concepts = client.search_runs([client.get_experiment_by_name("benchmark-imageclef-concepts").experiment_id])[0]
    assert 0 <= concepts.data.metrics["prior/f1_primary"] <= 1
    captions = client.search_runs([client.get_experiment_by_name("benchmark-imageclef-captions").experiment_id])[0]
    assert "constant/rouge1" in captions.data.metrics and "constant/bertscore" not in captions.data.metrics
