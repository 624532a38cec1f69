"""Mixed precision under a budget without quantizing: layers of their own width (`layer_bits`) on a small ONNX
graph, what a configuration costs (weight memory, BOPs), the integer program against brute force, and bad
budgets and settings."""

from __future__ import annotations

import itertools

import pandas as pd
import pytest
from omegaconf import OmegaConf

from resnet8ptq.backends.onnx.widths import activation_widths, weight_overrides
from resnet8ptq.calibration import CalibConfig
from resnet8ptq.cost import configured_cost, layer_shapes, model_cost
from resnet8ptq.dtype import DtypeConfig
from resnet8ptq.errors import ConfigError, RaisedLayerError
from resnet8ptq.layers import check_layer_bits, check_own_widths, weight_widths
from resnet8ptq.search.budget import Candidate, check_budget_settings, check_feasible, solve
from resnet8ptq.search.target import TargetConfig
from resnet8ptq.spec import LayerPrecision, QuantSpec

from .test_mixed_precision import small_model

TENSORS = ["input", "model_1/t:0", "model_1/c:0", "model_1/r:0", "model_1/p:0", "model_1/f:0", "out"]
CONV_WEIGHT, DENSE_WEIGHT = "model_1/conv/ReadVariableOp:0", "model_1/dense/ReadVariableOp:0"


def _spec(layer_bits: dict[str, int] | None = None, first_last_bits: int | None = None) -> QuantSpec:
    dtype = DtypeConfig("uint8", "int8", 4, 4, first_last_bits)
    return QuantSpec(
        dtype, CalibConfig("minmax"), per_channel=True, layer_bits=tuple((layer_bits or {}).items())
    )


def test_layers_of_their_own_width_and_those_that_follow_them() -> None:
    """The ReLU at 6 bits takes its pool and reshape along; the conv's weight at 2 bits gets a 2-bit grid."""
    model = small_model()
    spec = _spec({"r": 6, "conv": 2})
    assert weight_widths(model, spec) == {CONV_WEIGHT: 2, DENSE_WEIGHT: 4}
    widths = activation_widths(model, spec, TENSORS)
    assert widths == {"input": 4, "model_1/t:0": 4, "model_1/c:0": 4, "model_1/r:0": 6, "model_1/p:0": 6,
                      "model_1/f:0": 6, "out": 8}  # fmt: skip
    scales = [float(entry["scale"]) for entry in weight_overrides(model, spec)[CONV_WEIGHT]]
    assert scales == pytest.approx([1.0, 1.0])  # all-ones weights on the 2-bit grid -1..1


def test_a_configuration_costs_memory_and_bit_operations() -> None:
    """Conv: 2x3 weights over 4x4 outputs (96 MACs) reading the transposed input; dense: 2x10 weights once
    (20 MACs) reading the ReLU through the reshape and the pool."""
    model = small_model()
    shapes = {shape.weight: (shape.reads, shape.macs, shape.params) for shape in layer_shapes(model)}
    assert shapes == {"conv": ("t", 96, 6), "dense": ("r", 20, 20)}
    uniform = configured_cost(model, _spec())
    assert (uniform.weight_memory_bits, uniform.bops) == (26 * 4, 96 * 16 + 20 * 16)
    mixed = configured_cost(model, _spec({"conv": 2, "r": 6}))
    assert (mixed.weight_memory_bits, mixed.bops) == (6 * 2 + 20 * 4, 96 * 2 * 4 + 20 * 4 * 6)


@pytest.mark.parametrize(
    ("layer_bits", "first_last_bits", "message"),
    [
        ({"nope": 4}, None, r"\['nope'\] are not layers of this model"),
        ({"p": 4}, None, "p takes the quantization of r; set r instead"),
        ({"conv": 4}, 8, "conv is a first or last layer, kept at dtype.first_last_bits=8"),
        ({"r": 3}, None, "r=3: activations take 4..8 bits"),
        ({"out": 4}, None, "are the logits or follow them"),
    ],
)
def test_bad_layer_bits_are_refused_before_any_work(
    layer_bits: dict[str, int], first_last_bits: int | None, message: str
) -> None:
    with pytest.raises(RaisedLayerError, match=message):
        check_layer_bits(_spec(layer_bits, first_last_bits), small_model())


def test_widths_outside_2_to_8_bits_are_refused_by_the_spec() -> None:
    with pytest.raises(ValueError, match=r"expected 2\.\.8 bits"):
        _spec({"conv": 16})


def test_a_saved_model_must_hold_the_widths() -> None:
    model = small_model()
    spec = _spec({"conv": 2, "r": 6})
    held = [
        LayerPrecision("conv", "weight", "int8", 2),
        LayerPrecision("r", "activation", "uint8", 6),
        LayerPrecision("p", "activation", "uint8", 6),
    ]
    assert check_own_widths(held, model, spec) == "conv=2, p=6, r=6"
    assert check_own_widths(held, model, _spec()) is None
    with pytest.raises(RuntimeError, match="weight conv: 4 bits, not 2"):
        check_own_widths([LayerPrecision("conv", "weight", "int8", 4), *held[1:]], model, spec)
    with pytest.raises(RuntimeError, match="r not quantized by this backend's recipe"):
        check_own_widths(held[:1], model, spec)


CANDIDATES = [
    Candidate("conv", "weight", CONV_WEIGHT),
    Candidate("dense", "weight", DENSE_WEIGHT),
    Candidate("t", "activation", "model_1/t:0"),
    Candidate("r", "activation", "model_1/r:0"),
]


def _noise(target: TargetConfig) -> pd.DataFrame:
    """A made-up sensitivity: the noise halves per extra bit, the dense layer and the ReLU matter more."""
    weight = {"conv": 1.0, "dense": 5.0, "t": 0.5, "r": 3.0}
    rows = []
    for candidate in CANDIDATES:
        choices = target.weight_choices if candidate.kind == "weight" else target.activation_choices
        rows += [
            {"layer": candidate.layer, "bits": b, "noise": weight[candidate.layer] * 2.0**-b} for b in choices
        ]
    return pd.DataFrame(rows)


@pytest.mark.parametrize(
    ("max_bops", "max_weight_bits"), [(2000, None), (3000, None), (None, 100), (2500, 120)]
)
def test_the_integer_program_finds_the_least_noise_within_the_budget(
    max_bops: float | None, max_weight_bits: float | None
) -> None:
    """Against every combination of widths: the same least noise, within both budgets."""
    model = small_model()
    target = TargetConfig(max_bops=max_bops, max_weight_bits=max_weight_bits)
    candidates = CANDIDATES if max_bops is not None else CANDIDATES[:2]
    noise = _noise(target)
    mix = solve(model, _spec(), candidates, noise, target)
    shapes = layer_shapes(model)
    table = noise.set_index(["layer", "bits"])["noise"]
    options = [target.weight_choices if c.kind == "weight" else target.activation_choices for c in candidates]
    best = None
    for combination in itertools.product(*options):
        bits = dict(zip((c.layer for c in candidates), combination, strict=True))
        cost = model_cost(shapes, {"conv": bits["conv"], "dense": bits["dense"]},
                          {"t": bits.get("t", 4), "r": bits.get("r", 4)})  # fmt: skip
        if (max_bops or float("inf")) < cost.bops or (
            max_weight_bits or float("inf")
        ) < cost.weight_memory_bits:
            continue
        total = sum(table[(layer, b)] for layer, b in bits.items())
        best = total if best is None else min(best, total)
    assert mix.predicted_noise == pytest.approx(best)
    assert mix.cost.bops <= (max_bops or float("inf"))
    assert mix.cost.weight_memory_bits <= (max_weight_bits or float("inf"))
    assert mix.cost == model_cost(
        shapes, {k: mix.bits[k] for k in ("conv", "dense")}, {k: mix.bits.get(k, 4) for k in ("t", "r")}
    )


def test_a_budget_no_mix_meets_is_refused_with_what_the_narrowest_needs() -> None:
    """Narrowest: weights at 2 bits, inputs at 4: 96*2*4 + 20*2*4 = 928 BOPs; 26*2 = 52 weight bits."""
    with pytest.raises(ConfigError, match=r"target.max_bops=900: no mix fits.*needs 928"):
        check_feasible(small_model(), _spec(), CANDIDATES, TargetConfig(max_bops=900))
    with pytest.raises(ConfigError, match=r"target.max_weight_bits=50: no mix fits.*needs 52"):
        check_feasible(small_model(), _spec(), CANDIDATES[:2], TargetConfig(max_weight_bits=50))
    check_feasible(small_model(), _spec(), CANDIDATES, TargetConfig(max_bops=928))


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"max_bops": 0}, "target.max_bops=0: expected a positive budget"),
        ({"max_weight_bits": -1.0}, "target.max_weight_bits=-1.0"),
        ({"weight_choices": [1, 4]}, r"target.weight_choices=\[1, 4\]: expected distinct widths in 2..8"),
        ({"activation_choices": [3, 8]}, r"activation_choices=\[3, 8\]: expected distinct widths in 4..8"),
        ({"activation_choices": []}, "activation_choices"),
    ],
)
def test_bad_budgets_are_refused(settings: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TargetConfig(**settings)


def test_a_budget_does_not_combine_with_a_drop_target_or_given_widths() -> None:
    base = {"layer_bits": {}, "raised_layers": [], "target": {"max_bops": 1e6, "max_drop_points": None}}
    check_budget_settings(OmegaConf.create(base), _spec())
    both = OmegaConf.create({**base, "target": {"max_bops": 1e6, "max_drop_points": 1.0}})
    with pytest.raises(ConfigError, match="an accuracy drop or fits a budget, not both"):
        check_budget_settings(both, _spec())
    given = OmegaConf.create({**base, "layer_bits": {"conv": 4}})
    with pytest.raises(ConfigError, match="leave layer_bits and raised_layers empty"):
        check_budget_settings(given, _spec())


def test_one_sensitivity_serves_every_configured_width(tmp_path) -> None:
    """The table measures one layer at a time with the rest FP32: the configured widths do not enter its
    cache key, the candidates and their choices do."""
    from pathlib import Path

    from resnet8ptq.search.budget import sensitivity_key

    path, target = Path("resnet8-x.onnx"), TargetConfig(max_bops=1e9)
    w4a4 = QuantSpec(DtypeConfig("uint8", "int8", 4, 4), CalibConfig("minmax"), per_channel=True)
    w8a8 = QuantSpec(DtypeConfig("uint8", "int8", 8, 8), CalibConfig("minmax"), per_channel=True)
    key = sensitivity_key(path, w4a4, target, CANDIDATES, 100, 42)
    assert sensitivity_key(path, w8a8, target, CANDIDATES, 100, 42) == key
    assert sensitivity_key(path, w4a4, target, CANDIDATES[:2], 100, 42) != key
    assert (
        sensitivity_key(path, w4a4, TargetConfig(max_bops=1e9, weight_choices=[4, 8]), CANDIDATES, 100, 42)
        != key
    )
