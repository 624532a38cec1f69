"""The `mcu` settings and the boards a model is checked against (one YAML per board in ``conf/mcu/boards/``;
numpy-free, imported by the config schema)."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from resnet8ptq.errors import ConfigError

KIB = 1024


@dataclass
class Board:
    """A microcontroller board: its core, clock, on-chip RAM and flash (KiB, as datasheets give "KB")."""

    core: str = MISSING
    clock_mhz: float = MISSING
    ram_kib: float = MISSING
    flash_kib: float = MISSING
    description: str = ""


@dataclass
class McuConfig:
    """``enabled``: run every TFLite model (and MLPerf Tiny's) in TFLM and check it against the ``boards``
    (the `mcu/boards` group's choices). A board fits when RAM >= arena + ``runtime_ram_kib`` and flash >=
    model + ``runtime_flash_kib``: allowances for what is not measured here (the TFLM runtime and kernels'
    code, the application, stack and I/O buffers), stated, not measured. ``npu``: the Arm Ethos-U
    configuration Vela compiles each int8 model for, for its estimate (null: no estimate); Vela's default
    system configuration sets the clock and memories (for the U55: ``Ethos_U55_High_End_Embedded``, 500 MHz,
    weights in off-chip flash). ``images``: TFLM runs the first N test images (null: every one). TFLM is
    the slowest part of a TFLite run (MLPerf's int8 ResNet8: 15 ms an image on one core of an AMD EPYC Zen
    3, 2.9x LiteRT's reference kernels and 14x its optimised ones: bench/mcu.py); its accuracy, its agreement
    with the reference kernels and the report are then over those N, named so."""

    enabled: bool = True
    boards: dict[str, Board] = field(default_factory=dict)  # the boards checked: the mcu/boards group
    runtime_ram_kib: float = 16.0  # RAM allowed beyond the arena (runtime, stack, I/O): stated, not measured
    runtime_flash_kib: float = 128.0  # flash allowed beyond the model (TFLM's code, the application)
    npu: str | None = "ethos-u55-128"
    images: int | None = None  # TFLM runs the first N test images; null: every one

    def __post_init__(self) -> None:
        if self.images is not None and self.images < 1:
            raise ValueError(
                f"mcu.images={self.images}: expected a count of test images >= 1, or null (all)."
            )
        for name in ("runtime_ram_kib", "runtime_flash_kib"):
            if getattr(self, name) < 0:
                raise ValueError(f"mcu.{name}={getattr(self, name)}: expected a number of KiB >= 0.")
        if self.npu is not None and self.npu not in NPU_CONFIGS:
            raise ValueError(
                f"mcu.npu={self.npu}: expected one of Vela's accelerator configurations "
                f"({', '.join(NPU_CONFIGS)}) or null."
            )


NPU_CONFIGS = (
    "ethos-u55-32",
    "ethos-u55-64",
    "ethos-u55-128",
    "ethos-u55-256",
    "ethos-u65-256",
    "ethos-u65-512",
    "ethos-u85-128",
    "ethos-u85-256",
    "ethos-u85-512",
    "ethos-u85-1024",
    "ethos-u85-2048",
)
"""Vela's ``--accelerator-config`` values (the number: MACs per cycle)."""


def mcu_settings(section: DictConfig) -> McuConfig:
    """The composed `mcu` section as :class:`McuConfig`, checked: ConfigError names a board's missing or bad
    figure."""
    for name, board in section.boards.items():
        missing = [
            key for key in ("core", "clock_mhz", "ram_kib", "flash_kib") if OmegaConf.is_missing(board, key)
        ]
        if missing:
            raise ConfigError(
                f"mcu.boards.{name} has no {', '.join(missing)}: a board needs its core, clock_mhz, ram_kib "
                f"and flash_kib (conf/mcu/boards/*.yaml)."
            )
        for key in ("clock_mhz", "ram_kib", "flash_kib"):
            if board[key] <= 0:
                raise ConfigError(f"mcu.boards.{name}.{key}={board[key]}: expected a positive number.")
    try:
        return OmegaConf.to_object(section)
    except (ValueError, MissingMandatoryValue) as err:
        raise ConfigError(f"mcu: {err}") from err
