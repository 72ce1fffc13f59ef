"""Entry point: ``python -m training.train task=task1 [overrides]`` (what ``make train`` runs).

A mistake of the user's (a broken manifest or release, an override naming a setting the chosen config lacks or
giving a number as text) ends with its message alone, as Hydra's own config errors do; ``HYDRA_FULL_ERROR=1``
shows the traceback (:mod:`training.errors`).
"""

import shlex

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from training.config_files import CONFIGS
from training.errors import hydra_user_errors, run_hydra_entry


@hydra.main(config_path=str(CONFIGS), config_name="train", version_base="1.3")
@hydra_user_errors()
def main(cfg: DictConfig) -> None:
    # Imported here, not at the top: a mistyped command line is then answered before torch and Lightning load.
    from training.pipeline import run_training

    run_training(cfg, resume_command=make_train_command)


def make_train_command(run_id: str) -> str:
    """``make train`` with this command line's overrides and ``resume=<run id>``: what continues that run."""
    overrides = [o for o in HydraConfig.get().overrides.task if not o.startswith(("task=", "resume="))]
    return f'make train TASK={HydraConfig.get().runtime.choices.task} ARGS="{shlex.join([*overrides, f"resume={run_id}"])}"'


if __name__ == "__main__":
    run_hydra_entry(main, "train")
