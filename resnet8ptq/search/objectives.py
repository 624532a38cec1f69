"""The `search` settings: the objectives a sweep returns (read from what the run logged, so a resumed run
gives the values it logged), their Optuna directions, and the record of an Optuna search on the sweep run
(its settings, and which run each trial was)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from omegaconf import OmegaConf

OBJECTIVES = {
    "accuracy": "maximize",
    "model_size_bytes": "minimize",
    "throughput_img_s": "maximize",
    "latency_ms_b1": "minimize",
    # device runs (device=integer|cim): the accuracy on the device and what its chip costs (components)
    "accuracy_device": "maximize",
    "device_energy_uj": "minimize",
    "device_area_mm2": "minimize",
    "device_latency_us": "minimize",
}
"""The metrics a search may optimise (as the runs log them) and the direction each is optimised in."""

DIRECTIONS_RESOLVER = "search_directions"
"""``${search_directions:${search.objectives}}``: the Optuna directions of the objectives (the preset's
``direction``), so that naming the objectives is enough."""

SWEEP_TAG_PREFIX = "search."
TRIAL_TAG_PREFIX = "search.trial."
"""Sweep-run tag ``search.trial.<job number>``: the run a trial was (new or reused), or ``refused: <why>``."""
REFUSED = "refused: "
OPTUNA_SWEEPER = "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"


@dataclass
class SearchConfig:
    """``objectives``: the metrics the task returns, in order (one: a float; several: a list, for
    multi-objective search). ``calib_params``: per calibration method, the settings a search tries only with
    that method (setting -> choices; :mod:`.space`)."""

    objectives: list[str] = field(default_factory=lambda: ["accuracy"])
    calib_params: dict[str, dict[str, list[Any]]] = field(
        default_factory=lambda: {
            "percentile": {"calib.percentile": [99.9, 99.99, 99.999, 99.9999]},
            "entropy": {"calib.num_quantized_bins": [128, 256, 512]},
        }
    )

    def __post_init__(self) -> None:
        directions(self.objectives)


def directions(objectives: Sequence[str]) -> list[str]:
    """The Optuna direction of each objective; ValueError names an unknown or repeated one."""
    unknown = [name for name in objectives if name not in OBJECTIVES]
    if unknown or not objectives or len(set(objectives)) < len(objectives):
        raise ValueError(
            f"search.objectives={list(objectives)}: expected distinct names among {', '.join(OBJECTIVES)}."
        )
    return [OBJECTIVES[name] for name in objectives]


if not OmegaConf.has_resolver(DIRECTIONS_RESOLVER):
    OmegaConf.register_new_resolver(DIRECTIONS_RESOLVER, lambda objectives: directions(list(objectives)))


def objective_values(
    metrics: Mapping[str, float], objectives: Sequence[str], run: str, key: str = "accuracy"
) -> list[float]:
    """The objectives' values among a run's logged ``metrics``; ValueError if one was not logged. ``accuracy``
    and ``accuracy_device`` stand for the model's metric (``key``: :attr:`resnet8ptq.metrics.Metric.key`),
    so that a search over an autoencoder maximises its ``auc``."""
    names = [name.replace("accuracy", key, 1) if name.startswith("accuracy") else name for name in objectives]
    missing = [name for name in names if name not in metrics]
    if missing:
        raise ValueError(f"Run {run} logged no {', '.join(missing)}: it cannot be an objective of this run.")
    return [float(metrics[name]) for name in names]


def is_optuna(sweeper: Mapping[str, Any] | None) -> bool:
    """Whether the Hydra sweeper config is hydra-optuna-sweeper's."""
    return bool(sweeper) and sweeper.get("_target_") == OPTUNA_SWEEPER


def sweep_tags(sweeper: Mapping[str, Any], objectives: Sequence[str]) -> dict[str, str]:
    """What the sweep run records of an Optuna search: objectives, directions, sampler, trials, space."""
    params = {**(sweeper.get("params") or {})}
    return {
        "search.objectives": ",".join(objectives),
        "search.directions": ",".join(directions(objectives)),
        "search.sampler": str(sweeper.get("sampler", {}).get("_target_", "?")).rsplit(".", 1)[-1],
        "search.n_trials": str(sweeper.get("n_trials", "?")),
        "search.space": "; ".join(f"{key}={value}" for key, value in params.items())[:5000] or "(overrides)",
    }


def trial_tag(job_number: int) -> str:
    """The sweep-run tag of trial ``job_number`` (zero-padded, so tags sort in trial order)."""
    return f"{TRIAL_TAG_PREFIX}{job_number:04d}"
