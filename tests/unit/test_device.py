"""The device model's arithmetic on small synthetic layers: TFLite's fixed point against a plain scalar
transcription of its C code, the fast requantization against the exact one, the crossbar's tiling and
slicing, and the `device` settings' validation."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from resnet8ptq.device.adc import Geometry, LayerSteps
from resnet8ptq.device.cim import CrossbarArithmetic
from resnet8ptq.device.config import Crossbar, DeviceConfig
from resnet8ptq.device.executor import Ideal, integer_conv2d, requantize_exact
from resnet8ptq.device.fixed_point import (
    ROUNDINGS,
    multiply_by_quantized_multiplier,
    quantize_multiplier,
)
from resnet8ptq.device.graph import Conv, Quant
from resnet8ptq.device.mapping import slices, tile_sizes

pytestmark = pytest.mark.device


def tflite_mbqm(x: int, multiplier: int, shift: int) -> int:
    """TFLite's MultiplyByQuantizedMultiplier, statement by statement from common.h (Python ints)."""
    left, right = max(shift, 0), max(-shift, 0)
    a, b = x * (1 << left), multiplier
    ab = a * b
    nudge = (1 << 30) if ab >= 0 else (1 - (1 << 30))
    total = ab + nudge
    high = abs(total) // (1 << 31) * (1 if total >= 0 else -1)  # C's division truncates toward zero
    mask = (1 << right) - 1
    remainder = high & mask
    threshold = (mask >> 1) + (1 if high < 0 else 0)
    return (high >> right) + (1 if remainder > threshold else 0)


def test_quantize_multiplier_known_values() -> None:
    multiplier, shift = quantize_multiplier(np.array([0.5, 0.25, 0.75, 1.0, 0.0]))
    assert multiplier.tolist() == [2**30, 2**30, 3 * 2**29, 2**30, 0]
    assert shift.tolist() == [0, -1, 0, 1, 0]


def test_mbqm_matches_tflite_c_code() -> None:
    rng = np.random.default_rng(0)
    x = rng.integers(-(2**24), 2**24, 2000)
    reals = rng.uniform(1e-4, 0.9, 2000)
    multiplier, shift = quantize_multiplier(reals)
    ours = multiply_by_quantized_multiplier(x, multiplier, shift)
    theirs = [tflite_mbqm(int(a), int(m), int(s)) for a, m, s in zip(x, multiplier, shift, strict=True)]
    assert ours.tolist() == theirs


@pytest.mark.parametrize("rounding", ["double", "single"])
def test_fast_requantization_equals_exact_integer_arithmetic(rounding: str) -> None:
    """Half-way values included: accumulators chosen so that acc·scale lands on and next to .5."""
    rng = np.random.default_rng(1)
    channels = 8
    multiplier, shift = quantize_multiplier(rng.uniform(1e-3, 0.05, channels))
    scale = multiplier * np.exp2(shift - 31.0)
    targets = rng.integers(-150, 150, (64, channels)) + 0.5  # half-way values of the output
    acc = np.round(targets / scale)[:, :, None, None] + rng.integers(-2, 3, (64, channels, 1, 1))
    acc = np.concatenate([acc, rng.integers(-(2**16), 2**16, (64, channels, 1, 1))])
    exact = ROUNDINGS[rounding](
        acc.astype(np.int64), multiplier.reshape(1, -1, 1, 1), shift.reshape(1, -1, 1, 1)
    )
    expected = np.clip(exact - 5, -128, 127)
    fast = requantize_exact(
        torch.from_numpy(acc.astype(np.float32)), multiplier, shift, -5, -128, 127, rounding
    )
    assert fast.numpy().astype(np.int64).tolist() == expected.tolist()


def test_tiles_split_as_aihwkit_lightning() -> None:
    assert tile_sizes(576, 128) == [116, 115, 115, 115, 115]
    assert tile_sizes(27, 64) == [27]
    assert tile_sizes(144, None) == [144]
    assert sum(tile_sizes(288, 100)) == 288


@pytest.mark.parametrize(
    ("bits", "total", "signed"), [(1, 8, False), (3, 8, False), (2, 9, True), (4, 9, True)]
)
def test_slices_add_back_to_the_value(bits: int, total: int, signed: bool) -> None:
    low = -(2 ** (total - 1)) if signed else 0
    high = 2 ** (total - 1) - 1 if signed else 2**total - 1
    values = torch.arange(low, high + 1, dtype=torch.float32)
    digits = slices(values, bits, total, signed)
    assert len(digits) == -(-total // bits)
    assert torch.equal(sum(d * 2.0**s for d, s in digits), values)


def conv_layer(rng: np.random.Generator, channels_in: int = 16, channels_out: int = 8) -> Conv:
    quant = Quant(0.05, -128, -128, 127)
    weight = rng.integers(-127, 128, (channels_out, channels_in, 3, 3)).astype(np.int32)
    multiplier, shift = quantize_multiplier(np.full(channels_out, 0.003))
    return Conv(
        name="conv",
        input="x",
        output="y",
        weight=weight,
        weight_zero_point=np.zeros(channels_out, np.int32),
        weight_scale=np.full(channels_out, 0.01, np.float32),
        bias=rng.integers(-1000, 1000, channels_out).astype(np.int32),
        stride=(1, 1),
        padding=(1, 1, 1, 1),
        input_quant=quant,
        output_quant=quant,
        multiplier=multiplier,
        shift=shift,
        act_min=-128,
        act_max=127,
    )


def centred_input(rng: np.random.Generator, layer: Conv, n: int = 4) -> torch.Tensor:
    return torch.from_numpy(rng.integers(0, 256, (n, layer.weight.shape[1], 8, 8)).astype(np.float32))


@pytest.mark.parametrize(
    "crossbar",
    [
        Crossbar(),
        Crossbar(rows=32),
        Crossbar(rows=50, dac_bits=2, bits_per_cell=2, cells_per_weight=4),
        Crossbar(dac_bits=1, bits_per_cell=1, cells_per_weight=7, accumulator_bits=40),
    ],
    ids=["one-tile", "tiles", "sliced", "bit-serial"],
)
def test_ideal_crossbar_equals_integer_accumulators(crossbar: Crossbar) -> None:
    """Tiles, bit-serial inputs and weight slices change nothing while the ADC is ideal and nothing is
    noisy."""
    rng = np.random.default_rng(2)
    layer = conv_layer(rng)
    x = centred_input(rng, layer)
    expected = Ideal().accumulate(layer, x)
    assert torch.equal(CrossbarArithmetic(crossbar).accumulate(layer, x).to(expected.dtype), expected)


@pytest.mark.parametrize(("kernel", "stride", "size"), [(3, 1, 10), (3, 2, 17), (1, 2, 8), (1, 1, 1)])
def test_the_gemm_convolution_equals_torch_conv(kernel: int, stride: int, size: int) -> None:
    """The im2col product (the CUDA path, run here on the CPU) gives the same integers as torch's conv,
    for every kernel, stride and shape of ResNet8 (a dense layer is a 1x1 conv on a 1x1 input)."""
    rng = np.random.default_rng(7)
    x = torch.from_numpy(rng.integers(-128, 128, (3, 5, size, size)).astype(np.float32))
    weight = torch.from_numpy(rng.integers(-127, 128, (6, 5, kernel, kernel)).astype(np.float32))
    expected = torch.nn.functional.conv2d(x, weight, stride=stride)
    assert torch.equal(integer_conv2d(x, weight, stride, gemm=True), expected)
    assert torch.equal(integer_conv2d(x, weight, stride), expected)  # on the CPU: torch's conv


@pytest.mark.parametrize(("groups", "multiplier", "stride"), [(5, 1, 1), (5, 2, 2), (1, 6, 1)])
def test_the_grouped_gemm_convolution_equals_torch_conv(groups: int, multiplier: int, stride: int) -> None:
    """A depthwise convolution (one group per input channel, any depth multiplier) as the CUDA path's
    group-by-group im2col product gives torch's grouped conv's integers."""
    rng = np.random.default_rng(8)
    x = torch.from_numpy(rng.integers(-128, 128, (3, 5, 11, 11)).astype(np.float32))
    shape = (groups * multiplier, 5 // groups, 3, 3)
    weight = torch.from_numpy(rng.integers(-127, 128, shape).astype(np.float32))
    expected = torch.nn.functional.conv2d(x, weight, stride=stride, groups=groups)
    assert torch.equal(integer_conv2d(x, weight, stride, gemm=True, groups=groups), expected)
    assert torch.equal(integer_conv2d(x, weight, stride, groups=groups), expected)


@pytest.mark.parametrize(
    ("activation", "expected"), [("NONE", (-128, 127)), ("RELU", (-3, 127)), ("RELU6", (-3, 27))]
)
def test_fused_activations_clamp_as_tflite(activation: str, expected: tuple[int, int]) -> None:
    """TFLite's CalculateActivationRangeQuantized: zero point + round(bound / scale), in the type's range
    (scale 0.2, zero point -3: ReLU6's 6 is 30 steps up)."""
    from types import SimpleNamespace

    from ai_edge_litert import schema_py_generated as schema

    from resnet8ptq.backends.tflite.integer import NotInteger, activation_range

    options = SimpleNamespace(fusedActivationFunction=getattr(schema.ActivationFunctionType, activation))
    assert activation_range(options, "CONV_2D", Quant(0.2, -3, -128, 127)) == expected
    tanh = SimpleNamespace(fusedActivationFunction=schema.ActivationFunctionType.TANH)
    with pytest.raises(NotInteger, match="CONV_2D with fused activation TANH"):
        activation_range(tanh, "CONV_2D", Quant(0.2, -3, -128, 127))


def test_a_relu6_between_a_layer_and_its_quantization_clamps_its_output() -> None:
    """The ONNX and PyTorch readers' ReLU6 (Clip(0, 6), hardtanh): the output's clamp is the zero point up to
    6 / scale steps (rounded half to even, as the quantizer rounds), within the type; elsewhere than after a
    conv or dense layer it is refused."""
    from resnet8ptq.device.qdq import QdqLayer, lower, lower_conv

    q_in, q_out = Quant(0.5, 0, -128, 127), Quant(0.2, -3, -128, 127)
    layer = QdqLayer("conv", "c", ["x"], "y", weight=np.ones((2, 1, 1, 1), np.int8), weight_scale=0.1,
                     weight_zero_point=0, relu=True, relu_max=6.0)  # fmt: skip
    conv = lower_conv(layer, q_in, q_out, {})
    assert (conv.act_min, conv.act_max) == (-3, 27)
    wide = lower_conv(dataclasses.replace(layer, relu_max=100.0), q_in, q_out, {})
    assert wide.act_max == 127
    pool = QdqLayer("max_pool", "p", ["x"], "y", relu=True, relu_max=6.0)
    with pytest.raises(ValueError, match="clamp \\(ReLU6\\) after a max_pool layer is not covered"):
        lower("onnx", [pool], {"x": q_in, "y": q_in}, "x", {}, [])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_gives_the_cpu_integers() -> None:
    rng = np.random.default_rng(8)
    layer = conv_layer(rng)
    x = centred_input(rng, layer)
    for arithmetic in (Ideal(), CrossbarArithmetic(Crossbar(rows=50, dac_bits=2, cells_per_weight=2))):
        assert torch.equal(arithmetic.accumulate(layer, x.cuda()).cpu(), arithmetic.accumulate(layer, x))


def test_adc_and_noise_change_the_accumulators() -> None:
    rng = np.random.default_rng(3)
    layer = conv_layer(rng)
    x = centred_input(rng, layer)
    ideal = Ideal().accumulate(layer, x).double()
    geometry = Geometry(tiles=5, slices=1, outputs=8)  # 144 terms at 32 rows
    steps = {"conv": LayerSteps.symmetric(geometry, "layer", np.array([2.0**12]), 3)}
    coarse = CrossbarArithmetic(Crossbar(rows=32, adc_bits=3), adc_steps=steps).accumulate(layer, x)
    assert not torch.equal(coarse, ideal)
    assert torch.all(coarse % 2**12 == 0)  # every partial sum read in steps of 2^12
    noisy = [CrossbarArithmetic(Crossbar(weight_noise=0.02), seed=s).accumulate(layer, x) for s in (0, 0, 1)]
    assert torch.equal(noisy[0], noisy[1]) and not torch.equal(noisy[0], noisy[2])  # seeded draws


def test_saturating_accumulator() -> None:
    rng = np.random.default_rng(4)
    layer = conv_layer(rng)
    x = centred_input(rng, layer)
    acc = CrossbarArithmetic(Crossbar(rows=16, accumulator_bits=12)).accumulate(layer, x)
    assert acc.max() <= 2**11 - 1 and acc.min() >= -(2**11)
    assert not torch.equal(acc, Ideal().accumulate(layer, x).double())


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"kind": "cim", "rows": 0}, "device.rows=0"),
        ({"kind": "cim", "adc_bits": 0}, "device.adc_bits=0"),
        ({"kind": "cim", "weight_noise": -0.1}, "device.weight_noise=-0.1"),
        ({"kind": "cim", "adc_range": "largest"}, "device.adc_range='largest'"),
        ({"kind": "none", "rows": 64}, "device.rows=64 with device=none"),
        ({"kind": "integer", "adc_bits": 6}, "device.adc_bits=6 with device=integer"),
        ({"kind": "gpu"}, "device='gpu'"),
    ],
)
def test_impossible_settings_fail_with_the_setting_named(settings: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        DeviceConfig(**settings)


def test_cells_must_hold_the_weights() -> None:
    DeviceConfig(kind="cim", bits_per_cell=2, cells_per_weight=4).check_weights("int8", 8)  # 8 >= 7 bits
    with pytest.raises(ValueError, match="hold 6 magnitude bits; 8-bit int8 weights need 7"):
        DeviceConfig(kind="cim", bits_per_cell=2, cells_per_weight=3).check_weights("int8", 8)
    with pytest.raises(ValueError, match="need 8"):
        DeviceConfig(kind="cim", bits_per_cell=7).check_weights("uint8", 8)


def test_run_name_labels() -> None:
    assert DeviceConfig(kind="integer").label == "int"
    assert DeviceConfig(kind="cim").label == "cim"
    assert DeviceConfig(kind="cim", rows=64, adc_bits=4).label == "cim-r64-adc4"
    assert DeviceConfig(kind="cim", bits_per_cell=2, cells_per_weight=4, weight_noise=0.02).label == (
        "cim-c2x4-n0.02"
    )


def test_the_interval_over_noise_draws_is_the_t_interval_within_0_and_1() -> None:
    """Three draws: mean ± t(0.975, 2) · s / sqrt(3), t = 4.303; cut at 0 and 1 when it reaches past them."""
    from resnet8ptq.device.evaluate import seed_interval

    low, high = seed_interval([0.80, 0.82, 0.84])
    assert (low, high) == pytest.approx(
        (0.82 - 4.3027 * 0.02 / 3**0.5, 0.82 + 4.3027 * 0.02 / 3**0.5), abs=1e-4
    )
    assert seed_interval([0.40, 0.75, 0.97]) == (0.0, 1.0)  # 0.707 ± 0.714
