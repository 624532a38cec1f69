"""Mixed precision under a budget (`target.max_bops`, `target.max_weight_bits`): each layer's width chosen
from a set so that the model fits the budget with the least predicted error, then one ordinary run of that mix
(`layer_bits`).

1. **Sensitivity** (:func:`layer_sensitivity`): on the calibration sample, the FP32 model runs in torch
   (:class:`~resnet8ptq.simulation.Simulation`) with one layer alone quantized at one width, as the backends
   quantize it (weights rounded to nearest on their grid, per channel or not; activations with ``calib``'s
   range for that width), and the squared error of the logits against FP32 is that (layer, width)'s noise:
   every candidate layer at every width in the choices. Quantization noise of separate layers adds up to a
   good approximation (Zhou et al., AAAI 2018; the premise of HAWQ-V3's and AIMET AMP's per-layer
   measures), so the sum over layers predicts a mix's error.
2. **Choice** (:func:`solve`): an integer program, exact (scipy's HiGHS, as HAWQ-V3 solves its own): one width
   per candidate layer, the predicted error least, weight memory and bit operations (:mod:`resnet8ptq.cost`)
   within the budgets. BOPs multiply a layer's weight width by its input's, so each conv/gemm layer gets one
   binary per (weight width, input width) pair, tied to both layers' choices.

Candidates: every conv/gemm weight and, with `target.max_bops`, every activation a conv/gemm reads (its
input: HAWQ-V3's per-layer weight and activation widths); not the first and last layers when
`dtype.first_last_bits` holds them. The other activations keep ``dtype.activation_bits``: with only
`target.max_weight_bits` all of them (they are not in that budget), with `target.max_bops` those no conv/gemm
reads, which cost no bit operations (e.g. a residual branch's conv output before its add, which ONNX
Runtime's recipe stores and PyTorch's X86 recipe adds in the conv's epilogue: a width for it could not be
held by both backends).

The mix is chosen once on the FP32 model, before any `algo`: a configured algorithm then runs at the mix's
widths. Sensitivity runs on one torch thread (a mix must not depend on `threads`) and is cached on disk by
everything it depends on, so a sweep over budgets measures it once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx
import pandas as pd
from omegaconf import DictConfig, OmegaConf

from resnet8ptq.cost import ModelCost, configured_widths, layer_shapes, model_cost
from resnet8ptq.errors import ConfigError
from resnet8ptq.search.target import TargetConfig
from resnet8ptq.shared import Shared
from resnet8ptq.spec import QuantSpec

log = logging.getLogger(__name__)

TAG_PREFIX = "mixed_precision."
"""Run tags `mixed_precision.budget` (the budgets, e.g. ``bops<=221290496``), `.predicted_noise` (the solver's
sum of the chosen widths' noise, written with ``repr``: at full precision, comparable with the table),
`.candidates` (how many layers it chose widths for)."""
SENSITIVITY_DIR = "analysis"  # the run's artifact analysis/sensitivity.csv
SENSITIVITY_THREADS = 1


@dataclass(frozen=True)
class Candidate:
    """A layer whose width the search chooses: its layer name, kind, and ONNX tensor (or initializer)."""

    layer: str
    kind: str  # "weight" | "activation"
    tensor: str


@dataclass(frozen=True)
class Mix:
    """A chosen mix: widths of the candidate layers, what it costs, and its predicted noise."""

    bits: dict[str, int]
    cost: ModelCost
    predicted_noise: float


def run_within_budget(cfg: DictConfig, output_dir: Path, run: Callable[..., str], shared: Shared) -> str:
    """Choose the mix for ``cfg.target``'s budgets and run it (``run(cfg, output_dir, tags)``,
    :func:`resnet8ptq.pipeline.run`); return the run's id. A budget no mix meets is a ConfigError before any
    measurement. ``shared``: the process's shared objects (:mod:`resnet8ptq.shared`)."""
    from resnet8ptq.config import quant_spec
    from resnet8ptq.inputs import load_dataset
    from resnet8ptq.resolve import fp32_model, make_backend

    spec = quant_spec(cfg)  # validates `target` too: ConfigError before any work
    target = TargetConfig(**OmegaConf.to_container(cfg.target, resolve=True))
    check_budget_settings(cfg, spec)
    canonical = fp32_model(cfg.model, Path(cfg.cache_dir))
    model = onnx.load(canonical.onnx_path)
    candidates = choosable(model, spec, with_activations=target.max_bops is not None)
    check_feasible(model, spec, candidates, target)
    # A backend that cannot hold layers of their own width (TFLite) refuses before any measurement.
    make_backend(cfg, shared).check(replace(spec, layer_bits=tuple((c.layer, 8) for c in candidates)))
    images = load_dataset(shared, cfg.data, cfg.cache_dir).calibration_inputs
    key = sensitivity_key(
        canonical.onnx_path, spec, target, candidates, cfg.data.calib_per_class, cfg.data.seed
    )
    noise = cached_sensitivity(Path(cfg.cache_dir) / "sensitivity" / f"{key}.csv", model, spec, candidates,
                               target, images)  # fmt: skip
    mix = solve(model, spec, candidates, noise, target)
    log.info(
        "Mixed precision within %s: %s (weight memory %d bits, %.4g BOPs; predicted noise %.4g)",
        budget_label(target), ", ".join(f"{k}={v}" for k, v in sorted(mix.bits.items())),
        mix.cost.weight_memory_bits, mix.cost.bops, mix.predicted_noise,
    )  # fmt: skip
    mixed = cfg.copy()
    mixed.layer_bits = dict(sorted(mix.bits.items()))
    tags = {
        f"{TAG_PREFIX}budget": budget_label(target),
        f"{TAG_PREFIX}predicted_noise": repr(float(mix.predicted_noise)),
        f"{TAG_PREFIX}candidates": str(len(candidates)),
    }
    run_id = run(mixed, output_dir, tags)
    _log_sensitivity(run_id, noise, output_dir)
    return run_id


def check_budget_settings(cfg: DictConfig, spec: QuantSpec) -> None:
    """Fail on settings a budgeted search cannot combine with."""
    if cfg.target.max_drop_points is not None:
        raise ConfigError(
            "target.max_drop_points with target.max_bops/max_weight_bits: a search aims at an accuracy "
            "drop or fits a budget, not both. Set one of them to null."
        )
    if cfg.layer_bits or cfg.raised_layers:
        raise ConfigError(
            "target.max_bops/max_weight_bits choose every layer's width: leave layer_bits and raised_layers "
            "empty."
        )
    if spec.reduce_range:
        raise ConfigError("target.max_bops/max_weight_bits with reduce_range=true: set reduce_range=false.")
    if spec.dtype.activation_bits > 8 and cfg.target.max_bops is not None:
        raise ConfigError(
            f"target.max_bops with dtype.activation_bits={spec.dtype.activation_bits}: the search chooses "
            "activation widths of at most 8 bits; set dtype.activation_bits to 8 or less."
        )


def budget_label(target: TargetConfig) -> str:
    """``bops<=200000000, weight_bits<=313728``: the budgets set, exactly."""
    parts = []
    if target.max_bops is not None:
        parts.append(f"bops<={target.max_bops:.12g}")
    if target.max_weight_bits is not None:
        parts.append(f"weight_bits<={target.max_weight_bits:.12g}")
    return ", ".join(parts)


def choosable(model: onnx.ModelProto, spec: QuantSpec, with_activations: bool) -> list[Candidate]:
    """The layers the search chooses widths for (see the module's docstring), in model order."""
    from resnet8ptq.layers import wide_layers
    from resnet8ptq.model import layer_name
    from resnet8ptq.simulation import stored_activations
    from resnet8ptq.weight_grid import quantized_weights

    fixed = wide_layers(model, spec)
    found = [Candidate(layer_name(name), "weight", name) for name in quantized_weights(model)]
    if with_activations:
        read = {shape.reads for shape in layer_shapes(model)}
        sources = dict.fromkeys(stored_activations(model).values())
        found += [Candidate(layer_name(t), "activation", t) for t in sources if layer_name(t) in read]
    return [candidate for candidate in found if candidate.layer not in fixed]


def check_feasible(
    model: onnx.ModelProto, spec: QuantSpec, candidates: Sequence[Candidate], target: TargetConfig
) -> None:
    """ConfigError when even the narrowest mix (every candidate at its smallest choice) exceeds a budget."""
    shapes = layer_shapes(model)
    weights, activations = configured_widths(model, spec, shapes)
    for candidate in candidates:
        narrowest = min(target.weight_choices if candidate.kind == "weight" else target.activation_choices)
        (weights if candidate.kind == "weight" else activations)[candidate.layer] = narrowest
    least = model_cost(shapes, weights, activations)
    for name, budget, needed in (
        ("max_bops", target.max_bops, least.bops),
        ("max_weight_bits", target.max_weight_bits, least.weight_memory_bits),
    ):
        if budget is not None and needed > budget:
            raise ConfigError(
                f"target.{name}={budget:.6g}: no mix fits; the narrowest one (weights at "
                f"{min(target.weight_choices)} bits, activations at {min(target.activation_choices)} bits "
                f"where chosen, the rest as configured) needs {needed:.6g}. Raise the budget or the choices."
            )


def sensitivity_key(
    onnx_path: Path,
    spec: QuantSpec,
    target: TargetConfig,
    candidates: Sequence[Candidate],
    per_class: int,
    seed: int,
) -> str:
    """What a sensitivity table depends on, hashed: the model, the signedness, ranges and granularity, the
    candidates and their choices, the calibration sample, torch's version."""
    import torch

    parts = {  # not the configured widths: the other layers stay FP32 while one is measured
        "model": onnx_path.name,
        "dtype": [spec.dtype.activation, spec.dtype.weight],
        "calib": OmegaConf.to_yaml(OmegaConf.structured(spec.calib)),
        "per_channel": spec.per_channel,
        "choices": [list(target.weight_choices), list(target.activation_choices)],
        "candidates": [candidate.layer for candidate in candidates],
        "sample": [per_class, seed],
        "torch": torch.__version__,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def cached_sensitivity(
    path: Path,
    model: onnx.ModelProto,
    spec: QuantSpec,
    candidates: Sequence[Candidate],
    target: TargetConfig,
    images: np.ndarray,
) -> pd.DataFrame:
    """:func:`layer_sensitivity`, read from ``path`` when an earlier run measured it (written atomically)."""
    if path.exists():
        log.info("Sensitivity: reusing %s", path)
        return pd.read_csv(path)
    from resnet8ptq.hardware import torch_threads

    with torch_threads(SENSITIVITY_THREADS):  # the mix must not depend on `threads`
        table = layer_sensitivity(
            model, spec, candidates, target.weight_choices, target.activation_choices, images
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    table.to_csv(partial, index=False)
    partial.replace(path)
    return table


def layer_sensitivity(
    model: onnx.ModelProto,
    spec: QuantSpec,
    candidates: Sequence[Candidate],
    weight_choices: Sequence[int],
    activation_choices: Sequence[int],
    images: np.ndarray,
) -> pd.DataFrame:
    """Per candidate layer and width: the mean squared error of the logits on ``images`` with that layer
    alone quantized at that width (columns layer, kind, bits, noise)."""
    import torch
    from tqdm import tqdm

    from resnet8ptq.calibration import RangeCollector, batches
    from resnet8ptq.simulation import (
        LearnedStep,
        Simulation,
        logits_block,
        stored_activations,
        weighted_module,
    )
    from resnet8ptq.weight_grid import channel_axis, quantized_weights, weight_grid

    stored = stored_activations(model)
    identity = torch.nn.Identity()
    quantizers: dict[str, torch.nn.Module] = dict.fromkeys(set(stored.values()), identity)
    simulation = Simulation(model, stored, quantizers)  # type: ignore[arg-type]
    block = logits_block(simulation, model)
    inputs = torch.from_numpy(np.ascontiguousarray(images, np.float32))
    reference = simulation.run_all(block, inputs)
    activations = [c.tensor for c in candidates if c.kind == "activation"]
    collectors = {tensor: RangeCollector(spec.calib) for tensor in activations}
    if collectors:
        reference_values = Simulation(model, stored)
        for batch in batches(images, spec.calib.batch_size):
            values = reference_values.values(torch.from_numpy(np.ascontiguousarray(batch, np.float32)))
            for tensor, collector in collectors.items():
                collector.add(values[tensor].numpy())
    weights = quantized_weights(model)
    rows = []
    total = sum(len(weight_choices if c.kind == "weight" else activation_choices) for c in candidates)
    progress = tqdm(total=total, desc="sensitivity", unit="width")
    for candidate in candidates:
        if candidate.kind == "weight":
            node, weight = weights[candidate.tensor]
            module = weighted_module(simulation.gm.get_submodule(node.name))
            original = module.weight.data.clone()
            for bits in weight_choices:
                grid = weight_grid(weight, channel_axis(node), spec, bits)
                rounded = torch.from_numpy(grid.dequantize(grid.quantize(weight)).astype(np.float32))
                module.weight.data = rounded.T if tuple(original.shape) != weight.shape else rounded
                rows.append(_row(candidate, bits, simulation.run_all(block, inputs), reference))
                progress.update()
            module.weight.data = original
        else:
            for bits in activation_choices:
                qrange = spec.dtype.activation_range(bits)
                low, high = collectors[candidate.tensor].compute(qrange)
                quantizers[candidate.tensor] = LearnedStep(low, high, qrange)
                rows.append(_row(candidate, bits, simulation.run_all(block, inputs), reference))
                progress.update()
            quantizers[candidate.tensor] = identity
    progress.close()
    return pd.DataFrame(rows)


def _row(candidate: Candidate, bits: int, logits, reference) -> dict[str, object]:
    noise = float(((logits.double() - reference.double()) ** 2).mean())
    return {"layer": candidate.layer, "kind": candidate.kind, "bits": bits, "noise": noise}


def solve(
    model: onnx.ModelProto,
    spec: QuantSpec,
    candidates: Sequence[Candidate],
    noise: pd.DataFrame,
    target: TargetConfig,
) -> Mix:
    """The mix of least total noise within the budgets: an integer program over one binary per (candidate,
    width) and, with a BOPs budget, per (conv/gemm layer, weight width, input width)."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    shapes = layer_shapes(model)
    fixed_weights, fixed_activations = configured_widths(model, spec, shapes)
    choices = {
        c.layer: list(target.weight_choices if c.kind == "weight" else target.activation_choices)
        for c in candidates
    }
    table = noise.set_index(["layer", "bits"])["noise"]
    index: dict[tuple, int] = {}
    cost: list[float] = []
    for candidate in candidates:
        for bits in choices[candidate.layer]:
            index[("x", candidate.layer, bits)] = len(cost)
            cost.append(float(table[(candidate.layer, bits)]))
    rows: list[dict[int, float]] = []
    lower: list[float] = []
    upper: list[float] = []

    def constrain(coefficients: dict[int, float], low: float, high: float) -> None:
        rows.append(coefficients)
        lower.append(low)
        upper.append(high)

    for candidate in candidates:  # one width per candidate
        constrain({index[("x", candidate.layer, b)]: 1.0 for b in choices[candidate.layer]}, 1, 1)

    def widths(layer: str, fixed: dict[str, int]) -> list[int]:
        return choices.get(layer, [fixed[layer]])

    if target.max_weight_bits is not None:
        memory: dict[int, float] = {}
        constant = 0.0
        for shape in shapes:
            if shape.weight in choices:
                for bits in choices[shape.weight]:
                    memory[index[("x", shape.weight, bits)]] = float(shape.params * bits)
            else:
                constant += shape.params * fixed_weights[shape.weight]
        constrain(memory, -np.inf, target.max_weight_bits - constant)
    if target.max_bops is not None:
        bops: dict[int, float] = {}
        for shape in shapes:  # z[layer, w, a]: this layer's weights at w, its input at a
            pairs = [(w, a) for w in widths(shape.weight, fixed_weights)
                     for a in widths(shape.reads, fixed_activations)]  # fmt: skip
            for w, a in pairs:
                index[("z", shape.weight, w, a)] = len(cost)
                cost.append(0.0)
                bops[index[("z", shape.weight, w, a)]] = float(shape.macs * w * a)
            constrain({index[("z", shape.weight, w, a)]: 1.0 for w, a in pairs}, 1, 1)
            for layer, position in ((shape.weight, 0), (shape.reads, 1)):
                if layer not in choices:
                    continue
                for bits in choices[layer]:
                    tied = {
                        index[("z", shape.weight, *pair)]: 1.0 for pair in pairs if pair[position] == bits
                    }
                    tied[index[("x", layer, bits)]] = -1.0
                    constrain(tied, 0, 0)
        constrain(bops, -np.inf, target.max_bops)
    matrix = np.zeros((len(rows), len(cost)))
    for i, coefficients in enumerate(rows):
        for j, value in coefficients.items():
            matrix[i, j] = value
    result = milp(
        np.array(cost),
        constraints=LinearConstraint(matrix, lower, upper),
        integrality=np.ones(len(cost)),
        bounds=Bounds(0, 1),
    )
    if result.status != 0 or result.x is None:
        raise ConfigError(f"No mix fits {budget_label(target)}: the solver reports {result.message}")
    bits = {layer: b for (kind, layer, *rest) in index if kind == "x" for b in rest
            if result.x[index[("x", layer, b)]] > 0.5}  # fmt: skip
    weights = fixed_weights | {c.layer: bits[c.layer] for c in candidates if c.kind == "weight"}
    activations = fixed_activations | {c.layer: bits[c.layer] for c in candidates if c.kind == "activation"}
    predicted = float(sum(table[(layer, b)] for layer, b in bits.items()))
    return Mix(bits, model_cost(shapes, weights, activations), predicted)


def _log_sensitivity(run_id: str, noise: pd.DataFrame, output_dir: Path) -> None:
    """The sensitivity table as the run's ``analysis/sensitivity.csv``."""
    from resnet8ptq.tracking.runs import log_artifacts

    path = output_dir / "sensitivity.csv"
    noise.to_csv(path, index=False)
    log_artifacts(run_id, [(SENSITIVITY_DIR, path)])
