"""A run's datasets and description as MLflow shows them."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pandas as pd
from omegaconf import OmegaConf

from training.tracking.run_context import dataset_inputs, describe


def _cfg(**extra):
    return OmegaConf.create({"task": {"name": "task2"}, "model": {"name": "resnet18"}, "loss": {"name": "asl"},
                             "sampler": {"name": "class_aware"}, "seed": 7, **extra})  # fmt: skip


def test_description_names_what_was_trained_on_what():
    assert describe(_cfg(), "nih14", "ab12") == (
        "task2: resnet18 with asl loss and class_aware sampling, seed 7; data nih14 (manifest ab12)."
    )
    text = describe(_cfg(adapter={"name": "semantic"}, stage={"name": "crt"}), "nih14", "ab12")
    assert "zero-shot adapter semantic, stage crt, seed 7" in text


def test_one_dataset_per_split_with_the_manifest_fingerprint_as_digest(tmp_path: Path):
    table = pd.DataFrame({"image_id": ["a", "b", "c", "d"], "split": ["train", "train", "val", "test"]})
    manifest = SimpleNamespace(fingerprint="c2834b923386", source_file=tmp_path / "manifest.csv")
    datamodule = SimpleNamespace(
        manifest=manifest, source=SimpleNamespace(name="synthetic"),
        split_frame=lambda split: table[table["split"] == split].reset_index(drop=True),
    )  # fmt: skip
    inputs = dataset_inputs(datamodule)
    assert [(i.dataset.name, i.dataset.digest, [(t.key, t.value) for t in i.tags]) for i in inputs] == [
        (f"synthetic-{split}", "c2834b923386", [("mlflow.data.context", split)]) for split in ("train", "val", "test")
    ]
    assert '"num_rows": 2' in inputs[0].dataset.profile  # the train rows, not the whole manifest


def test_experiments_are_marked_as_model_training_unless_already_chosen(tmp_path):
    from training.tracking.run_context import EXPERIMENT_KIND, mark_model_training
    from training.tracking.uri import tracking_client

    client = tracking_client(f"sqlite:///{tmp_path}/mlflow.db")
    fresh = client.create_experiment("task1")
    chosen = client.create_experiment("genai", tags={EXPERIMENT_KIND[0]: "genai_development"})
    for experiment in (fresh, chosen):
        mark_model_training(client, experiment)
    assert client.get_experiment(fresh).tags[EXPERIMENT_KIND[0]] == "custom_model_development"
    assert client.get_experiment(chosen).tags[EXPERIMENT_KIND[0]] == "genai_development"


def _module(table: pd.DataFrame, val_rows: int | None = None):
    """A data module over ``table`` whose val split is cut to its first ``val_rows`` rows, as a subset does."""
    manifest = SimpleNamespace(labels=("Effusion",), table=table)
    frame = lambda split: table[table["split"] == split].reset_index(drop=True).iloc[:val_rows]  # noqa: E731
    return SimpleNamespace(manifest=manifest, split_frame=frame)


def test_the_validation_fingerprint_follows_the_validation_rows_and_debug_follows_the_debug_preset():
    from training.tracking.run_context import comparability_tags

    table = pd.DataFrame({"image_id": ["t1", "v1", "v2", "x1"], "split": ["train", "val", "val", "test"],
                          "Effusion": ["0", "1", "0", "1"]})  # fmt: skip
    more_training = pd.concat([table, pd.DataFrame({"image_id": ["t2"], "split": ["train"], "Effusion": ["1"]})])
    relabelled = table.assign(Effusion=["0", "0", "0", "1"])
    full, debug = _cfg(data={"debug_size": None}), _cfg(data={"debug_size": {"train": 1, "val": 1, "test": 1}})
    tags = comparability_tags(full, _module(table))
    assert tags["cxrlt.debug"] == "false" and comparability_tags(debug, _module(table))["cxrlt.debug"] == "true"
    fingerprint = tags["cxrlt.val_fingerprint"]
    assert len(fingerprint) == 12
    # other training rows, same validation rows: comparable; a cut or a changed label: not
    assert comparability_tags(full, _module(more_training))["cxrlt.val_fingerprint"] == fingerprint
    assert comparability_tags(full, _module(table, val_rows=1))["cxrlt.val_fingerprint"] != fingerprint
    assert comparability_tags(full, _module(relabelled))["cxrlt.val_fingerprint"] != fingerprint


def test_a_runs_display_name_leads_with_debug_and_ends_with_its_config_key():
    from omegaconf import OmegaConf

    from training.tracking.session import display_name

    full = OmegaConf.create({"run_name": "task1_a-convnextv2_base-db-rfs-s42", "data": {"image_size": 512}})
    smoke = OmegaConf.create({"run_name": "regnetx_004-bce-random-s42", "data": {"debug_size": {"train": 320}}})
    assert display_name(full, "0123456789abcdef") == "task1_a-convnextv2_base-db-rfs-s42-012345"
    assert display_name(smoke, "fedcba9876543210") == "debug-regnetx_004-bce-random-s42-fedcba"
