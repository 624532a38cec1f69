"""Entry point: `python run.py [overrides]` runs one configuration, `python run.py -m ...` sweeps."""

import logging

import hydra
from omegaconf import DictConfig

import resnet8ptq.config  # noqa: F401  (registers the typed schema `base_config` and the group schemas)
from resnet8ptq.app import task


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float:
    return task(cfg)


if __name__ == "__main__":
    # A log record that cannot be written (e.g. the job's log file on a full disk) is dropped instead of
    # printing a traceback beside the run's own one-line error (Python's advice for production use).
    logging.raiseExceptions = False
    main()
