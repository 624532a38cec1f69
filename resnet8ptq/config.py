"""Typed schema of the Hydra config (registered as ``base_config``): wrong types fail at composition."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from resnet8ptq.backends.base import QuantSpec
from resnet8ptq.calibration import CalibSpec


@dataclass
class DtypeConfig:
    activation: str = MISSING
    weight: str = MISSING


@dataclass
class CalibConfig:
    method: str = MISSING
    symmetric: bool = False
    num_bins: int | None = None
    num_quantized_bins: int | None = None
    percentile: float | None = None
    batch_size: int = 100


@dataclass
class DataConfig:
    root: str = "data"
    download: bool = True
    calib_per_class: int = 100
    seed: int = 42


@dataclass
class ModelConfig:
    path: str | None = None
    sha256: str | None = None


@dataclass
class MlflowConfig:
    tracking_uri: str | None = None
    experiment: str = "resnet8ptq"


@dataclass
class ReportConfig:
    enabled: bool = True
    max_drop_points: float = 5.0


@dataclass
class Config:
    backend: Any = MISSING  # each backend's own options; `name` selects the implementation
    dtype: DtypeConfig = field(default_factory=DtypeConfig)
    calib: CalibConfig = field(default_factory=CalibConfig)
    per_channel: bool = False
    reduce_range: bool = False  # weights in 7 bits (ORT's reduce_range)
    native_tolerance_points: float = 0.3  # largest |native - reference| accuracy gap tagged `native`
    threads: int | None = None
    rerun: bool = False  # run configurations that already have a FINISHED run with the same config_hash
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    cache_dir: str = MISSING
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
    report: ReportConfig = field(default_factory=ReportConfig)


ConfigStore.instance().store(name="base_config", node=Config)


class ConfigError(ValueError):
    """A setting has a value of the right type that is not allowed (e.g. calib.percentile=101)."""


def quant_spec(cfg: DictConfig) -> QuantSpec:
    """The quantization settings of a composed config (validated: ConfigError names the bad setting)."""
    calib = OmegaConf.to_container(cfg.calib, resolve=True)
    if cfg.native_tolerance_points < 0:
        raise ConfigError(
            f"native_tolerance_points={cfg.native_tolerance_points}: expected a number of points >= 0."
        )
    try:
        return QuantSpec(
            activation=cfg.dtype.activation,
            weight=cfg.dtype.weight,
            calib=CalibSpec(**calib),
            per_channel=cfg.per_channel,
            reduce_range=cfg.reduce_range,
        )
    except ValueError as err:
        raise ConfigError(str(err)) from err
