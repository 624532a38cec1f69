"""What identifies a run's result: the resolved settings that decide it, hashed as `config_hash`, and the code
version (`git_commit`)."""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from resnet8ptq.algorithms import parameter_defaults
from resnet8ptq.device.config import RANGE_ALIASES, DeviceConfig

PROJECT_DIR = Path(__file__).resolve().parents[1]


RESULT_KEYS = (
    "backend",
    "dtype",
    "calib",
    "algo",
    "per_channel",
    "reduce_range",
    "raised_layers",
    "layer_bits",
    "native_tolerance_points",
    "data.name",
    "data.calib_per_class",
    "data.seed",
    # Not the accuracy but what the run holds: a run without them is not reused by a sweep that wants them.
    "layer_analysis",
    "mlflow.log_models",
    "device",
    "components",
)
DEVICE_ONLY = ("components",)
"""Keys under RESULT_KEYS that decide only a device run's result (what its chip costs): a run without a
device is hashed without them, so that earlier runs keep their config_hash."""
NOT_RESULT = ("device.batch_size", "algo.reuse", "components.required")
"""Keys under RESULT_KEYS that change how a run computes, not what it gives (memory per step: a noisy
crossbar draws its read noise per image, whatever the batch; whether the algorithms' output may come from an
earlier run's; whether a design no component model covers is refused or run uncosted)."""


GROUP_CHOICES = ("backend", "dtype", "calib", "algo", "device", "components")

ADDED_DEFAULTS = {
    "data.name": "cifar10",  # the only data before the `data` group (issue 73)
    "dtype.activation_bits": "8",
    "dtype.weight_bits": "8",
    "dtype.first_last_bits": "None",
    "calib.weights": "minmax",
    "algo.steps": "[]",
    "algo.device_aware": "False",
    "algo.device_noise": "False",
    "raised_layers": "[]",
    "layer_analysis": "True",
    "mlflow.log_models": "True",
    **{key: str(value) for key, value in parameter_defaults().items()},  # each algorithm's, from its module
    **{
        f"device.{item.name}": str(item.default)
        for item in fields(DeviceConfig)
        if f"device.{item.name}" not in NOT_RESULT
    },
    # Costs before power gating was a setting (issue 75): every unit leaks over the whole inference.
    "components.power_gating": "False",
    "components.gated_leakage": "0.0",
    # The ADC's range rule before the calibrated rules came (issue 41): the largest sum, per layer, symmetric.
    "device.adc_range": "max",
    "device.adc_granularity": "layer",
    "device.adc_window": "symmetric",
}
"""Settings added after runs were tracked, at the value that gives the earlier result: left out of the hash
at that value, so the earlier runs keep their config_hash and resumed sweeps still find them. The algorithms'
parameters and the device's settings enter at their defaults, read from their schemas: a later change of one
of those defaults must write its earlier value here."""

VALUE_ALIASES = {"device.adc_range": RANGE_ALIASES}
"""Earlier names of a setting's value, hashed as the value they name (``device.adc_range=calibrated`` is
``max``): a run under the old name keeps its config_hash."""


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def run_params(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config, flattened, plus the config-group choices (`backend`, `dtype`, `calib`)."""
    params = flatten(OmegaConf.to_container(cfg, resolve=True))
    if HydraConfig.initialized():
        choices = HydraConfig.get().runtime.choices
        params.update({group: choices[group] for group in GROUP_CHOICES if group in choices})
    return params


def result_settings(params: Mapping[str, Any]) -> dict[str, str]:
    """The settings in ``params`` that decide a run's result (:data:`RESULT_KEYS`, less
    :data:`NOT_RESULT`), by their hashed names and values, those at an :data:`ADDED_DEFAULTS` value left
    out. Paths, the tracking store, `rerun` and the report settings do not count."""
    prefixes = tuple(f"{key}." for key in RESULT_KEYS)
    relevant = {
        key: str(value)
        for key, value in params.items()
        if key not in GROUP_CHOICES + NOT_RESULT and (key in RESULT_KEYS or key.startswith(prefixes))
    }
    if str(params.get("device.kind", "none")) == "none":
        device_only = tuple(f"{key}." for key in DEVICE_ONLY)
        relevant = {
            k: v for k, v in relevant.items() if k not in DEVICE_ONLY and not k.startswith(device_only)
        }
    relevant = {key: VALUE_ALIASES.get(key, {}).get(value, value) for key, value in relevant.items()}
    return {key: value for key, value in relevant.items() if ADDED_DEFAULTS.get(key) != value}


def config_hash(params: Mapping[str, Any], identity: Mapping[str, str]) -> str:
    """A short hash of what determines a run's result: :func:`result_settings` plus ``identity`` (the
    model's actual content and the library versions; the backend counts by its options and class)."""
    relevant = result_settings(params) | dict(identity)
    return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:16]


def git_commit() -> str:
    """The project's git commit (with `-dirty` for uncommitted changes), or `unknown`."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=PROJECT_DIR, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=PROJECT_DIR,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{commit}-dirty" if dirty else commit
