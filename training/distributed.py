"""Which process of a (possibly) distributed training this is, and how the others learn rank 0's run.

docs/rules.md §7 asks for one MLflow run per training, so only rank 0 opens it; the others still need its
checkpoint folder and the checkpoint to resume from (every rank must restore the same state, or DDP hangs).
Under Lightning's launcher the other ranks are re-executed from rank 0's environment, so the facts go in a
variable; under torchrun or ``srun`` all start together, so the process group is opened early and rank 0
broadcasts them. Ranks come from the Trainer's own cluster environment, so this never disagrees with Lightning.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

import lightning.pytorch as L
import torch.distributed as dist
from lightning.fabric.plugins.environments import LightningEnvironment

log = logging.getLogger(__name__)

SHARED_ENV = "CXRLT_DDP_RANK_ZERO"  # JSON handed by rank 0 to the local ranks Lightning's launcher starts


@dataclass(frozen=True)
class Process:
    """This process's place in the training: ``rank`` 0 of ``world_size`` in a single-process run."""

    rank: int
    world_size: int

    @property
    def is_zero(self) -> bool:
        return self.rank == 0


def process_of(trainer: L.Trainer) -> Process:
    """The global rank and world size the trainer will use, known before ``fit`` so rank 0 can open the run first.

    Lightning fills these in only when ``fit`` sets up the strategy; ``set_world_ranks`` now computes the same
    numbers from the same environment variables.
    """
    strategy = trainer.strategy
    if hasattr(strategy, "set_world_ranks") and getattr(strategy, "cluster_environment", None) is not None:
        strategy.set_world_ranks()
    return Process(rank=trainer.global_rank, world_size=trainer.world_size)


def share_from_rank_zero(trainer: L.Trainer, process: Process, make: Callable[[], dict]) -> dict:
    """Run ``make`` on rank 0 only and return its (JSON-able) result on every rank.

    Raises:
        RuntimeError: a non-zero rank that cannot reach rank 0's facts (a node started by hand without torchrun or
            SLURM), or whose rank 0 failed in ``make``: a clear error instead of a hang at the first collective.
    """
    if process.world_size == 1:
        return make()
    environment = trainer.strategy.cluster_environment
    if isinstance(environment, LightningEnvironment):
        return _through_environment(process, make)
    return _through_broadcast(trainer, process, make)


def _through_environment(process: Process, make: Callable[[], dict]) -> dict:
    if process.is_zero:
        facts = make()
        os.environ[SHARED_ENV] = json.dumps(facts)  # inherited by the ranks ``fit`` spawns next
        return facts
    shared = os.environ.get(SHARED_ENV)
    if shared is None:
        raise RuntimeError(
            f"rank {process.rank} of {process.world_size} was not started by rank 0's process, so it cannot learn "
            "rank 0's MLflow run; start multi-node DDP with torchrun or SLURM srun (docs/scaling.md)"
        )
    return json.loads(shared)


def _through_broadcast(trainer: L.Trainer, process: Process, make: Callable[[], dict]) -> dict:
    # The strategy's own setup opens the process group exactly as ``fit`` would (backend, timeout, device);
    # ``fit`` finds it open and reuses it. Objects travel over a gloo group so this also works when NCCL is the
    # training backend (NCCL cannot broadcast CPU objects).
    trainer.strategy.setup_environment()
    group = dist.new_group(backend="gloo")
    message: list[dict | None] = [None]
    error: BaseException | None = None
    if process.is_zero:
        try:
            message[0] = {"facts": make()}
        except BaseException as failure:  # tell the others before raising, or they wait for the timeout
            error = failure
            message[0] = {"error": f"{type(failure).__name__}: {failure}"}
    dist.broadcast_object_list(message, src=0, group=group)
    dist.destroy_process_group(group)
    if error is None and "error" not in message[0]:
        return message[0]["facts"]
    # No ``fit`` will run to tear the process group down: do it here, or gloo's threads are still joinable at
    # interpreter exit and the process dies of SIGABRT ("terminate called without an active exception").
    dist.destroy_process_group()
    if error is not None:
        raise error
    raise RuntimeError(f"rank 0 failed before training: {message[0]['error']}")


def forget_shared() -> None:
    """Drop rank 0's facts from the environment once ``fit`` has spawned its ranks (a later training in the
    same process, e.g. the next tuning trial, must not inherit a finished run's checkpoint folder)."""
    os.environ.pop(SHARED_ENV, None)
