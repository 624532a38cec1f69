"""Entry point: `python run.py [overrides]` runs one configuration, `python run.py -m ...` sweeps."""

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

import resnet8ptq.config  # noqa: F401  (registers the typed schema `base_config`)


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float:
    from pathlib import Path

    from resnet8ptq.pipeline import run

    return run(cfg, Path(HydraConfig.get().runtime.output_dir))


if __name__ == "__main__":
    main()
