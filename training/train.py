"""Entry point: ``python -m training.train task=task1 [overrides]`` (what ``make train`` runs)."""

import hydra
from omegaconf import DictConfig

from training.pipeline import run_training


@hydra.main(config_path="../configs", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run_training(cfg)


if __name__ == "__main__":
    main()
