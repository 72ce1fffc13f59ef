"""Each selectable head trains through the real CLI, and its finished run reloads into the network that was tested."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from tests.conftest import train_tiny_manifest_run
from training.runs import load_finished

pytestmark = pytest.mark.e2e  # trains through the real CLI: make test-e2e (docs/development.md)

# head -> (extra overrides, checkpoint keys only that head has)
HEADS = {
    "csra": ((), {"head.weight", "head.norm.running_mean"}),
    "ml_decoder": (("model.head.dim=16", "model.head.heads=2"), {"head.queries", "head.weight"}),
    "two_stage": (("aux_loss=linear",), {"head.gate.weight", "head.weight", "aux_head.weight"}),
    "moe": (("two_phase=moe", "callbacks.two_phase.switch_epoch=1"), {"head.expert_weight", "head.phase"}),
}


@pytest.mark.parametrize("head", sorted(HEADS))
def test_head_trains_and_its_run_reloads_to_the_tested_predictions(head, make_manifest, tmp_path, run_env):
    manifest = make_manifest(n=48)
    overrides, keys = HEADS[head]
    client, run = train_tiny_manifest_run(tmp_path, manifest, run_env, f"head={head}", *overrides,
                                          "trainer.max_epochs=2")  # fmt: skip
    assert run.info.status == "FINISHED" and run.data.params["model.head.name"] == head

    finished = load_finished(run.info.run_id, client)
    state = finished.network.state_dict()
    assert keys <= state.keys()
    if head == "moe":  # the kept checkpoint is chosen among phase-2 epochs: the one after the switch
        assert int(state["head.phase"]) == 2 and finished.network.head.in_phase_two
        assert run.data.metrics["best_epoch"] == 1

    predictions = pd.read_csv(client.download_artifacts(run.info.run_id, "predictions/test.csv", str(tmp_path)))
    paths = pd.read_csv(manifest).set_index("image_id").loc[predictions["image_id"], "path"]
    images = torch.stack([finished.transform(image=finished.decode(manifest.parent / p))["image"] for p in paths])
    network = finished.network
    with torch.no_grad():
        probs = torch.sigmoid(network(images)).numpy()
        stored = predictions[finished.labels].to_numpy()
        assert probs == pytest.approx(stored, abs=1e-4)  # the reloaded run is the network the test phase scored
        if head == "moe":  # and that network is the mixture, not the phase-1 linear head inside it
            linear = torch.sigmoid(F.linear(network.backbone(images), network.head.weight, network.head.bias))
            assert abs(linear.numpy() - stored).max() > 1e-4
