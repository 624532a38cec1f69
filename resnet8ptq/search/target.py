"""Mixed precision to a target accuracy drop (`target`): from the configured model, raise the layers the
per-layer SQNR analysis ranks worst to 16 bits (`raised_layers`), a few per step, each step a run of its own,
until the accuracy is within `target.max_drop_points` of the backend's FP32 model.

Every step is an ordinary run (its raised layers are part of its config_hash, so a repeated search reuses its
finished steps); the next step's layers are read from the previous step's logged analysis
(``analysis/layer_sqnr.csv``: lowest SQNR first; ``analysis/layer_precision.csv``: what is already 16-bit).
The result is the first step that meets the target: later steps only add 16-bit layers, so it has the fewest.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from resnet8ptq.errors import ConfigError, TargetNotReached
from resnet8ptq.spec import RAISED_BITS

log = logging.getLogger(__name__)

TAG_PREFIX = "mixed_precision."
"""Run tags `mixed_precision.step`, `.raised`, `.base_hash`; sweep-run tags `mixed_precision.<base hash>`."""


@dataclass
class TargetConfig:
    """Mixed precision. To an accuracy target: ``max_drop_points``, the largest accuracy drop (points vs the
    backend's FP32 model) to reach (None: off); ``layers_per_step``: layers raised per step; ``max_steps``:
    steps after the first run (None: until every layer is 16-bit). Under a budget
    (:mod:`resnet8ptq.search.budget`): ``max_bops`` (bit operations per image) and/or ``max_weight_bits``
    (weight memory in bits), each layer's width chosen from ``weight_choices``/``activation_choices``."""

    max_drop_points: float | None = None  # raise layers to 16 bits until the drop vs FP32 is this (points)
    layers_per_step: int = 1  # layers raised per step
    max_steps: int | None = None  # steps after the first run (null: until every layer is 16-bit)
    max_bops: float | None = None  # a budget of bit operations per image (null: none)
    max_weight_bits: float | None = None  # a budget of weight memory in bits (null: none)
    weight_choices: list[int] = field(
        default_factory=lambda: [2, 3, 4, 5, 6, 8]
    )  # widths a budget picks from
    activation_choices: list[int] = field(default_factory=lambda: [4, 5, 6, 8])  # the activations' widths

    def __post_init__(self) -> None:
        for name in ("max_bops", "max_weight_bits"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"target.{name}={value}: expected a positive budget, or null (off).")
        for name, allowed in (("weight_choices", range(2, 9)), ("activation_choices", range(4, 9))):
            values = list(getattr(self, name))
            if not values or any(v not in allowed for v in values) or len(set(values)) != len(values):
                raise ValueError(
                    f"target.{name}={values}: expected distinct widths in "
                    f"{allowed.start}..{allowed.stop - 1}."
                )
        if self.max_drop_points is not None and self.max_drop_points < 0:
            raise ValueError(
                f"target.max_drop_points={self.max_drop_points}: expected points >= 0, or null (off)."
            )
        if self.layers_per_step < 1:
            raise ValueError(f"target.layers_per_step={self.layers_per_step}: expected a positive number.")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"target.max_steps={self.max_steps}: expected a positive number, or null.")


@dataclass(frozen=True)
class Step:
    """One step of the search, as its run logged it."""

    number: int
    run_id: str
    config_hash: str
    drop_points: float  # FP32 accuracy minus this run's, in points
    raised: tuple[str, ...]  # layers the saved model holds at 16 bits (read back)

    def summary(self) -> str:
        """`step 3: run <id>, 12 layers at 16 bits, drop 0.07 points`."""
        return (
            f"step {self.number}: run {self.run_id}, {len(self.raised)} layers at {RAISED_BITS} bits, "
            f"drop {self.drop_points:.2f} points"
        )


def reach_target(cfg: DictConfig, output_dir: Path, run: Callable[..., str]) -> str:
    """Run steps until the drop is at most ``cfg.target.max_drop_points``; return the id of the run that meets
    it. ``run(cfg, output_dir, tags)`` runs one configuration (:func:`resnet8ptq.pipeline.run`). Raises
    :class:`TargetNotReached` (after recording it on the sweep run) when the steps end above the target."""
    try:
        target = TargetConfig(**OmegaConf.to_container(cfg.target, resolve=True))
    except ValueError as err:
        raise ConfigError(str(err)) from err
    assert target.max_drop_points is not None
    requested = list(cfg.raised_layers)
    steps: list[Step] = []
    while True:
        number = len(steps)
        step_cfg = cfg.copy()
        step_cfg.raised_layers = list(requested)
        tags = {f"{TAG_PREFIX}step": str(number), f"{TAG_PREFIX}target_points": f"{target.max_drop_points:g}"}
        run_id = run(step_cfg, output_dir / f"step_{number:02d}", tags)
        steps.append(read_step(number, run_id))
        log.info("Mixed precision %s (target %g points)", steps[-1].summary(), target.max_drop_points)
        if round(steps[-1].drop_points, 6) <= target.max_drop_points:
            _record(steps, target, f"reached at {steps[-1].summary()}")
            return run_id
        new = next_layers(run_id, target.layers_per_step)
        if target.max_steps is not None and number >= target.max_steps:
            why = f"target.max_steps={target.max_steps} reached"
        elif not new:
            why = f"no layer left to raise (every quantized layer is {RAISED_BITS}-bit)"
        else:
            requested += new
            continue
        message = (
            f"Mixed precision did not reach a drop of {target.max_drop_points:g} points: {why}; best "
            f"{min(steps, key=lambda s: s.drop_points).summary()}. Allow more steps (target.max_steps), "
            f"start from another configuration, or accept a larger drop."
        )
        _record(steps, target, f"not reached: {why}")
        raise TargetNotReached(message)


def read_step(number: int, run_id: str) -> Step:
    """A step's outcome from its run (new or reused): accuracy_delta, config_hash, raised layers."""
    from mlflow.tracking import MlflowClient

    run = MlflowClient().get_run(run_id)
    raised = run.data.tags.get(f"{TAG_PREFIX}raised", "")
    return Step(
        number,
        run_id,
        run.data.tags.get("config_hash", ""),
        -100.0 * run.data.metrics["accuracy_delta"],
        tuple(name for name in raised.split(",") if name),
    )


def next_layers(run_id: str, count: int) -> list[str]:
    """The ``count`` layers with the lowest SQNR in the run's analysis that are still narrower than 16 bits
    and have quantization parameters of their own (a layer that takes its input's follows that input)."""
    import pandas as pd
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    directory = Path(client.download_artifacts(run_id, "analysis"))
    errors = pd.read_csv(directory / "layer_sqnr.csv")
    precision = pd.read_csv(directory / "layer_precision.csv").drop_duplicates("layer").set_index("layer")
    unknown = sorted(set(errors["layer"]) - set(precision.index))
    if unknown:
        raise RuntimeError(
            f"Run {run_id}: layers {unknown} of layer_sqnr.csv are not in layer_precision.csv."
        )
    own = errors[errors["layer"].map(precision["takes_quantization_of"]).isna()]
    narrow = own[own["layer"].map(precision["bits"]) < RAISED_BITS]
    ranked = narrow.sort_values(["sqnr_db", "layer"], kind="stable")["layer"]
    return list(dict.fromkeys(ranked))[:count]


def _record(steps: list[Step], target: TargetConfig, outcome: str) -> None:
    """Note the search's outcome on the sweep run: tag `mixed_precision.<config_hash of the first step>`."""
    from mlflow.tracking import MlflowClient

    from resnet8ptq.tracking.sweep import current_sweep_run

    if parent := current_sweep_run():
        note = f"target {target.max_drop_points:g} points, {len(steps)} steps: {outcome}"
        MlflowClient().set_tag(parent, f"{TAG_PREFIX}{steps[0].config_hash}", note[:5000])
