"""Benchmarks as plug-ins: the catalog of configs/benchmark/, the YAML -> protocol loading, the command line's
messages, the interface types, and a toy protocol of another shape (image pairs, two findings, three readers,
plain bootstrap) run through the same shared runner and command line as pneumonia."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from mlflow import MlflowClient
from sklearn.metrics import cohen_kappa_score

from evaluation.benchmarks import cli
from evaluation.benchmarks.catalog import CONFIG_DIR, available, load_protocol
from evaluation.benchmarks.encoders import Encoded, Encoder, Target
from evaluation.benchmarks.protocol import BOOTSTRAPS, BadInput, Box, Prediction, Targets
from evaluation.benchmarks.runner import draw_subsets, run_benchmark
from evaluation.benchmarks.sampling import fingerprint
from evaluation.bootstrap import percentile_ci, resample_indices
from tests.benchmark_data import (
    FINDINGS,
    READERS,
    ToyProgressionProtocol,
    toy_reading,
    toy_truth,
    write_pairs,
    write_tiny_clip,
    write_toy_config,
)

# --- catalog and command line ------------------------------------------------------------------------------------


def test_every_config_is_listed_with_its_description_and_loads_as_its_name():
    listed = available()
    assert "pneumonia" in listed and listed["pneumonia"].startswith("Pediatric pneumonia (Kermany 2018)")
    assert listed["pneumonia"].endswith("[versions: full, n100]")
    for name in listed:
        assert load_protocol(name).name == name  # the file stem, the NAME= and the experiment name agree


def test_no_name_lists_the_protocols_and_exits_zero(capsys, tmp_path):
    assert cli.main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Benchmark protocols (configs/benchmark/):\n  pneumonia  Pediatric pneumonia")
    assert "Run one: make benchmark NAME=<name>" in out
    assert cli.main(["--config-dir", str(write_toy_config(tmp_path / "configs"))]) == 0
    assert "  toy  Toy reader study: did each finding worsen between two films? [versions: all, first12]" in (
        capsys.readouterr().out
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--name", "pneumonai", "--model", "clip:x", "--data-root", "."],
         f"make benchmark: unknown benchmark 'pneumonai'; known: pneumonia (configs in {CONFIG_DIR})"),
        (["--name", "pneumonia", "--model", "clip:x", "--data-root", ".", "--version", "n50"],
         "make benchmark: unknown version 'n50' of benchmark pneumonia; choose one of full, n100"),
        (["--name", "pneumonia", "--model", "clip:x", "--data-root", "/nonexistent/kermany"],
         "make benchmark: data root /nonexistent/kermany is not a folder (benchmark pneumonia reads its data set"),
        (["--name", "pneumonia", "--data-root", "."],
         "make benchmark: benchmark pneumonia needs MODEL (--model); usage:"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_naming_it_and_exit_2(argv, message, capsys):
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(message) and captured.err.count("\n") == 1 and "Traceback" not in captured.err
    assert captured.out == ""


def test_a_config_must_name_its_file_and_target_a_protocol(tmp_path):
    (tmp_path / "mismatch.yaml").write_text("_target_: tests.benchmark_data.ToyProgressionProtocol\nname: other\n")
    with pytest.raises(ValueError, match="name is 'other', expected the file's stem 'mismatch'"):
        load_protocol("mismatch", tmp_path)
    (tmp_path / "notaprotocol.yaml").write_text("_target_: builtins.dict\nname: notaprotocol\n")
    with pytest.raises(ValueError, match="is not a benchmark Protocol"):
        load_protocol("notaprotocol", tmp_path)
    with pytest.raises(BadInput, match="unknown benchmark 'nope'; known: mismatch, notaprotocol"):
        load_protocol("nope", tmp_path)


def test_the_yaml_target_and_settings_build_the_toy_protocol(tmp_path):
    protocol = load_protocol("toy", write_toy_config(tmp_path))
    assert isinstance(protocol, ToyProgressionProtocol)
    assert (protocol.name, protocol.seed, protocol.bootstrap, protocol.default_version) == ("toy", 7, "plain", "all")
    assert [t.label for t in protocol.targets] == list(FINDINGS)
    assert protocol.targets[1].positive_prompt == "a chest x-ray with pulmonary edema"
    with pytest.raises(ValueError, match="bootstrap must be one of"):
        ToyProgressionProtocol("toy", "", 7, {"all": None}, list(FINDINGS), {f: f for f in FINDINGS}, "jackknife")


# --- the interface types -----------------------------------------------------------------------------------------


def test_a_box_moves_between_pixel_frames():
    box = Box("Nodule", x=100, y=50, w=200, h=100, frame_width=1000, frame_height=500)
    moved = box.in_frame(224, 224)
    assert (moved.x, moved.y, moved.w, moved.h) == pytest.approx((22.4, 22.4, 44.8, 44.8))
    assert (moved.frame_width, moved.frame_height, moved.finding) == (224, 224, "Nodule")
    back = moved.in_frame(1000, 500)
    assert (back.x, back.y, back.w, back.h) == pytest.approx((100, 50, 200, 100))


def test_targets_resample_every_per_item_field_together():
    boxes = ((Box("A", 0, 0, 1, 1, 4, 4),), (), (Box("B", 1, 1, 2, 2, 4, 4), Box("A", 0, 0, 2, 2, 4, 4)))
    targets = Targets(
        "multilabel", ("A", "B"), np.array([[1, 0], [0, 0], [1, 1]]), readers=("r1", "r2"),
        reader_labels=np.array([[[1, 0], [1, 1]], [[0, 0], [0, 1]], [[1, 1], [1, 1]]]), boxes=boxes,
        texts=("a", "none", "a and b"), concepts=(frozenset({"C1"}), frozenset(), frozenset({"C1", "C2"})),
    )  # fmt: skip
    index = np.array([2, 2, 0])
    taken = targets.take(index)
    assert taken.labels.tolist() == [[1, 1], [1, 1], [1, 0]] and taken.reader_labels.shape == (3, 2, 2)
    assert taken.boxes == (boxes[2], boxes[2], boxes[0]) and taken.texts == ("a and b", "a and b", "a")
    assert taken.concepts[2] == frozenset({"C1"}) and taken.names == ("A", "B") and taken.readers == ("r1", "r2")
    prediction = Prediction(np.array([0.1, 0.2, 0.3]), np.array([False, False, True]), texts=("x", "y", "z"))
    assert prediction.take(index).texts == ("z", "z", "x") and prediction.take(index).scores.tolist() == [0.3, 0.3, 0.1]
    # The fingerprint records everything a reference holds: one reader's changed call changes it.
    ids = ["s1", "s2", "s3"]
    changed = targets.reader_labels.copy()
    changed[1, 1, 1] = 0
    other = Targets("multilabel", ("A", "B"), targets.labels, readers=("r1", "r2"), reader_labels=changed,
                    boxes=boxes, texts=targets.texts, concepts=targets.concepts)  # fmt: skip
    assert fingerprint(ids, targets.row_keys()) != fingerprint(ids, other.row_keys())
    assert fingerprint(ids[::-1], targets.row_keys()[::-1]) == fingerprint(ids, targets.row_keys())
    # A bare binary reference keeps the fingerprint the pneumonia subsets always had.
    binary = Targets("binary", ("Pneumonia",), np.array([1, 0, 1]))
    assert fingerprint(ids, binary.row_keys()) == fingerprint(ids, [1.0, 0.0, 1.0])


def test_targets_refuse_inconsistent_shapes():
    with pytest.raises(ValueError, match=r"must be \(2, 2\)"):
        Targets("multilabel", ("A", "B"), np.zeros(2))
    with pytest.raises(ValueError, match="class names"):
        Targets("multiclass", ("A",), np.zeros((2, 1), int))
    with pytest.raises(ValueError, match="texts has 1 entries for 2 items"):
        Targets("binary", ("A",), np.zeros(2), texts=("x",))
    with pytest.raises(ValueError, match="use bootstrap: plain"):
        Targets("multilabel", ("A", "B"), np.zeros((2, 2))).strata()
    progression = Targets("multiclass", ("Effusion",), np.array([[0], [2], [1]]), classes=("better", "same", "worse"))
    assert progression.strata().tolist() == [0, 2, 1]


# --- a toy protocol of another shape through the shared runner ---------------------------------------------------


class HalfBrightness(Encoder):
    """Zero-shot score = mean brightness of the image's left half (Effusion) or right half (Edema)."""

    image_size = 16

    def __init__(self, target: Target):
        self.spec, self.side = f"halves:{target.label}", 0 if target.label == "Effusion" else 1
        self.images = 0

    @property
    def identity(self) -> str:
        return self.spec

    def encode(self, images: np.ndarray) -> Encoded:
        self.images += len(images)
        halves = images.reshape(len(images), 16, 2, 8).mean(axis=(1, 3)) / 255.0  # (B, 2): left, right
        return Encoded(halves.astype(np.float32), halves[:, self.side])


def test_pairs_with_three_readers_and_two_findings_run_through_the_shared_runner(tmp_path):
    write_pairs(tmp_path / "data", n=24)
    protocol = load_protocol("toy", write_toy_config(tmp_path / "configs"))
    draw = draw_subsets(protocol, tmp_path / "data")
    assert draw.version == "all" and len(draw.test) == 24
    truth = draw.test.targets
    assert truth.labels.tolist() == [list(toy_truth(i)) for i in range(24)]  # the majority of the three readers
    assert truth.boxes[0][0] == Box("Effusion", 0, 0, 8, 16, 16, 16, reader="reader_a")
    assert truth.texts[1] == "effusion stable; edema worse"
    encoders = {t.label: HalfBrightness(t) for t in protocol.targets}
    result = run_benchmark(protocol, draw, encoders, tmp_path / "data", n_boot=300, cache_dir=tmp_path / "cache")
    # Every image column of every subset through every target's encoder, each with its own cache entry.
    assert [e.images for e in encoders.values()] == [48, 48] and len(list((tmp_path / "cache").glob("*.npz"))) == 4
    table = result.table.set_index(["protocol", "metric"])
    assert len(result.table) == 4 * 3
    # The model sees exactly which half brightened: perfect agreement with the majority, and reader_a is it.
    for method in ("model", "reader_a"):
        assert table.loc[(method, "kappa_mean"), ["value", "ci_low", "ci_high"]].tolist() == [1.0, 1.0, 1.0]
    # reader_b misreads Effusion on items 1, 5, 9, ...: kappa against the majority, as scikit-learn computes it.
    reader_b = np.array([toy_reading(i, "reader_b")[0] for i in range(24)])
    expected = cohen_kappa_score(truth.labels[:, 0], reader_b)
    assert table.loc[("reader_b", "kappa_effusion"), "value"] == pytest.approx(expected)
    assert table.loc[("reader_b", "kappa_edema"), "value"] == 1.0
    # Plain bootstrap over studies: resample b is evaluation.bootstrap's, with the protocol's seed.
    replicates = [cohen_kappa_score(truth.labels[idx, 0], reader_b[idx]) for idx in resample_indices(24, 300, 7)]
    low, high = percentile_ci(np.array(replicates))
    assert table.loc[("reader_b", "kappa_effusion"), "ci_low"] == pytest.approx(low)
    assert table.loc[("reader_b", "kappa_effusion"), "ci_high"] == pytest.approx(high)
    assert BOOTSTRAPS[protocol.bootstrap][0] == "of the test items"
    assert result.metrics()["reader_c/kappa_edema"] < 1.0 and list(result.scores.columns) == [
        "item_id", "model_change_effusion", "model_change_edema",
    ]  # fmt: skip
    again = run_benchmark(protocol, draw, encoders, tmp_path / "data", n_boot=300, cache_dir=tmp_path / "cache")
    assert again.cache_hits == {"test": True} and [e.images for e in encoders.values()] == [48, 48]
    pd.testing.assert_frame_equal(again.table, result.table)


def test_the_toy_protocol_through_the_command_line_into_mlflow(tmp_path, capsys):
    write_pairs(tmp_path / "data", n=24)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    argv = ["--name", "toy", "--config-dir", str(write_toy_config(tmp_path / "configs")), "--version", "first12",
            "--model", write_tiny_clip(tmp_path / "tiny"), "--data-root", str(tmp_path / "data"), "--n-boot", "50",
            "--tracking-uri", uri, "--cache-dir", str(tmp_path / "cache"),
            "--artifact-root", str(tmp_path / "art")]  # fmt: skip
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("# Benchmark toy (first12)\n") and "- test: 12 studies" in out
    assert "50 bootstrap resamples of the test items" in out
    assert "| metric (95% CI) | Model | Reader A | Reader B | Reader C |" in out and "| Kappa, Effusion |" in out
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("benchmark-toy").experiment_id])
    params, tags, metrics = run.data.params, run.data.tags, run.data.metrics
    assert params["n_test"] == "12" and params["readers"] == "3" and params["zero_shot"] == "margin"
    assert params["test_fingerprint"] == tags["benchmark.test_fingerprint"] and params["seed"] == "7"
    assert metrics["reader_a/kappa_mean"] == 1.0 and metrics["reader_a/kappa_mean_ci_low"] == 1.0
    reader_c = [toy_reading(i, "reader_c")[1] for i in range(12)]
    edema = [toy_truth(i)[1] for i in range(12)]
    assert metrics["reader_c/kappa_edema"] == pytest.approx(cohen_kappa_score(edema, reader_c))
    folder = client.download_artifacts(run.info.run_id, "", str(tmp_path / "dl"))
    subset = pd.read_csv(f"{folder}/subsets/test.csv")
    assert list(subset.columns[:3]) == ["item_id", "prior_path", "path"] and len(subset) == 12
    assert len(pd.read_csv(f"{folder}/table.csv")) == 4 * 3 and set(READERS) < set(
        pd.read_csv(f"{folder}/table.csv")["protocol"]
    )
