"""Entry point: `python run.py [overrides]` runs one configuration, `python run.py -m ...` sweeps."""

import errno

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException
from omegaconf import DictConfig

import resnet8ptq.config  # noqa: F401  (registers the typed schema `base_config`)

# Write failures that say what is wrong with the machine, not with the code.
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


class RunFailed(CompactHydraException):
    """A known failure (settings, data, model, tracking store, disk): printed as its message, no traceback."""


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float:
    from pathlib import Path

    from resnet8ptq.config import ConfigError
    from resnet8ptq.data import DataError
    from resnet8ptq.model import ModelError
    from resnet8ptq.pipeline import run
    from resnet8ptq.tracking import TrackingError

    output_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        return run(cfg, output_dir)
    except (ConfigError, DataError, ModelError, TrackingError) as err:  # the run is FAILED, error recorded
        raise RunFailed(f"{type(err).__name__}: {err}") from err
    except OSError as err:
        if err.errno not in DISK_ERRNOS:
            raise
        raise RunFailed(
            f"{type(err).__name__}: {err}. The run writes to its output directory {output_dir}, "
            f"the model cache {cfg.cache_dir} and the MLflow store: free space there or point them elsewhere."
        ) from err


if __name__ == "__main__":
    main()
