"""One integer description of a quantized network, whichever toolchain made it.

Every layer is what integer hardware computes: int8 (or uint8) activations with a scale and zero point,
integer weights with per-channel zero points, an int32 bias, an integer accumulator, and a requantization to
the output type as a fixed-point multiplier and shift (TFLite/gemmlowp's scheme, :mod:`.fixed_point`),
clamped to the output range (a fused ReLU is that clamp). Readers for the toolchains' saved models fill it in
(``backends/<name>/integer.py``); :mod:`.executor` runs it; :mod:`.export` writes it out for hardware teams.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from resnet8ptq.device.fixed_point import quantize_multiplier


@dataclass(frozen=True)
class Quant:
    """An activation tensor's quantization: real = scale · (q - zero_point), q in [qmin, qmax]."""

    scale: float
    zero_point: int
    qmin: int
    qmax: int

    def clamp_min(self, relu: bool) -> int:
        """The lowest output integer: ``qmin``, or the zero point's when a ReLU is fused (TFLite's
        ``CalculateActivationRangeQuantized``: max(qmin, zero_point + round(0 / scale)))."""
        return max(self.qmin, self.zero_point) if relu else self.qmin


RESIDUAL_FRACTION_BITS = 20
"""Fraction bits of the fixed-point sum of a fused conv + add (TFLite's add keeps 20 bits of headroom too)."""


@dataclass
class Residual:
    """A residual input added to a convolution's accumulator before its requantization (PyTorch's fused
    conv + add + ReLU, where the conv's output is never quantized on its own). In fixed point with
    ``RESIDUAL_FRACTION_BITS`` fraction bits: y = ((acc·A·2^F) + ((r - r_zp)·B·2^F) + 2^(F-1)) >> F, A =
    x_scale·w_scale/y_scale and B = r_scale/y_scale as (multiplier, shift) pairs, each rounded once; the
    multiplier/shift of the :class:`Conv` are then A·2^F's."""

    tensor: str
    quant: Quant
    multiplier: int  # B · 2^F
    shift: int


@dataclass
class Conv:
    """A convolution or fully-connected layer (a dense layer is a 1x1 convolution on a 1x1 input):
    acc = Σ (x - x_zp)(w - w_zp) + bias; y = clamp(MBQM(acc, multiplier, shift) + y_zp, act_min, act_max).
    A grouped convolution (``groups`` > 1; a depthwise one has one group per input channel) sums each output
    over its group's I = C_in / groups input channels only, as torch's ``conv2d(groups=...)``: output o reads
    group o // (O / groups)."""

    name: str
    input: str
    output: str
    weight: np.ndarray  # int32 (O, I, kh, kw)
    weight_zero_point: np.ndarray  # int32 (O,)
    weight_scale: np.ndarray  # float32 (O,): one value repeated when per tensor
    bias: np.ndarray  # int32 (O,), scale input_scale · weight_scale
    stride: tuple[int, int]
    padding: tuple[int, int, int, int]  # top, bottom, left, right (padded with the input's zero point)
    input_quant: Quant
    output_quant: Quant | None  # None: the output is the int32 accumulator (a float logits layer)
    multiplier: np.ndarray  # int64 (O,)
    shift: np.ndarray  # int64 (O,)
    act_min: int
    act_max: int
    dense: bool = False
    rounding: str = "double"  # MBQM's rounding (fixed_point.ROUNDINGS): TFLite's double, or single
    residual: Residual | None = None  # a quantized tensor added before requantization (fused conv + add)
    groups: int = 1  # input-channel groups: C_in for a depthwise convolution

    @property
    def depthwise(self) -> bool:
        """One input channel per group (TFLite's DEPTHWISE_CONV_2D, any depth multiplier)."""
        return self.groups > 1 and self.weight.shape[1] == 1

    @property
    def terms(self) -> int:
        """Products summed per output: C_in / groups · kh · kw (a crossbar's rows for one output)."""
        return int(np.prod(self.weight.shape[1:]))

    @property
    def accumulator_scale(self) -> np.ndarray:
        """The real value of one accumulator step, per channel: input_scale · weight_scale."""
        return np.float64(self.input_quant.scale) * self.weight_scale.astype(np.float64)

    @property
    def centered_weight(self) -> np.ndarray:
        """w - w_zp as int64 (O, I, kh, kw)."""
        return self.weight.astype(np.int64) - self.weight_zero_point.astype(np.int64).reshape(-1, 1, 1, 1)

    @property
    def weight_key(self) -> str:
        """:func:`weight_key` of its centred weights."""
        return weight_key(self.centered_weight)


def weight_key(centered: np.ndarray) -> str:
    """A layer's identity by its centred integer weights, outputs first (O, ...), in the term order of a
    crossbar's rows: how what was learned on the FP32 model's layers (device-aware ADC steps) finds the
    layer a backend made of each, whatever the backend names it."""
    import hashlib

    rows = np.ascontiguousarray(np.asarray(centered, np.int64).reshape(len(centered), -1))
    return hashlib.sha256(str(rows.shape).encode() + rows.tobytes()).hexdigest()[:16]


@dataclass
class Add:
    """An element-wise add of two quantized tensors, TFLite's integer scheme: both inputs shifted left by
    ``left_shift`` and rescaled to twice the larger input scale, summed, then requantized to the output."""

    name: str
    inputs: tuple[str, str]
    output: str
    input_quants: tuple[Quant, Quant]
    output_quant: Quant
    left_shift: int
    input_multipliers: tuple[int, int]
    input_shifts: tuple[int, int]
    output_multiplier: int
    output_shift: int
    act_min: int
    act_max: int
    rounding: str = "double"  # MBQM's rounding (fixed_point.ROUNDINGS), in all three rescalings


@dataclass
class AveragePool:
    """A global (or whole-window) average pool: the window's sum, divided by its size. ``rounding_divide``:
    TFLite's integer division rounded half away from zero (input and output share their quantization); else
    the sum requantized with ``multiplier``/``shift`` (input_scale / (count · output_scale))."""

    name: str
    input: str
    output: str
    input_quant: Quant
    output_quant: Quant
    rounding_divide: bool
    multiplier: int = 0
    shift: int = 0
    half_to_even: bool = False  # the division's ties to even (as a QDQ model's QuantizeLinear), not away


@dataclass
class MaxPool:
    """A max pool: each window's largest integer, exact (input and output share their quantization, as
    TFLite's MAX_POOL_2D requires and ONNX Runtime's and PyTorch's quantizers arrange). Padded positions
    never win (TFLite counts only the window's in-bounds values; ONNX and PyTorch pad with -inf)."""

    name: str
    input: str
    output: str
    output_quant: Quant
    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int, int, int] = (0, 0, 0, 0)  # top, bottom, left, right
    act_min: int | None = None  # a fused activation's clamp (TFLite); None: the type's range
    act_max: int | None = None


Layer = Conv | Add | AveragePool | MaxPool


@dataclass
class IntegerModel:
    """A quantized network as integer layers in execution order, from its quantized input to its logits (the
    last layer's output, before any softmax: its argmax is the prediction)."""

    source: str  # which reader made it, e.g. "tflite", "onnx-qdq", "torch-pt2e"
    input: str
    input_quant: Quant
    input_rounding: str  # how the float image is quantized: "half_away_from_zero" (TFLite) | "half_to_even"
    layers: list[Layer]
    notes: list[str] = field(default_factory=list)  # what the reader approximated, in words

    @property
    def output(self) -> str:
        return self.layers[-1].output

    def dequantize_output(self, values: np.ndarray) -> np.ndarray:
        """The last layer's integer outputs (N, classes) as real values: (q - zp) · scale, or the accumulator
        times its scale when the last layer is not requantized."""
        last = self.layers[-1]
        values = values.astype(np.float64)
        if last.output_quant is None:
            return values * last.accumulator_scale
        return (values - last.output_quant.zero_point) * last.output_quant.scale

    @property
    def convs(self) -> list[Conv]:
        return [layer for layer in self.layers if isinstance(layer, Conv)]

    def quant_of(self, tensor: str) -> Quant:
        """The quantization of a tensor: the model input's or the output of the layer making it."""
        if tensor == self.input:
            return self.input_quant
        for layer in self.layers:
            if layer.output == tensor:
                return layer.output_quant
        raise KeyError(tensor)


def conv_requantization(
    input_scale: float, weight_scale: np.ndarray, output_scale: float
) -> tuple[np.ndarray, np.ndarray]:
    """(multiplier, shift) per channel for input_scale · weight_scale / output_scale, in double precision
    from the float32 scales as TFLite's ``PopulateConvolutionQuantizationParams`` computes it."""
    real = np.float64(np.float32(input_scale)) * weight_scale.astype(np.float32).astype(np.float64)
    return quantize_multiplier(real / np.float64(np.float32(output_scale)))


def integer_add(
    name: str,
    inputs: tuple[str, str],
    output: str,
    quants: tuple[Quant, Quant],
    output_quant: Quant,
    relu: bool,
    rounding: str,
) -> Add:
    """An :class:`Add` of two 8-bit tensors with TFLite's parameters (:func:`add_requantization`)."""
    multipliers, shifts, out_multiplier, out_shift = add_requantization(
        (quants[0].scale, quants[1].scale), output_quant.scale
    )
    return Add(
        name=name,
        inputs=inputs,
        output=output,
        input_quants=quants,
        output_quant=output_quant,
        left_shift=20,
        input_multipliers=multipliers,
        input_shifts=shifts,
        output_multiplier=out_multiplier,
        output_shift=out_shift,
        act_min=output_quant.clamp_min(relu),
        act_max=output_quant.qmax,
        rounding=rounding,
    )


def add_requantization(
    scales: tuple[float, float], output_scale: float, left_shift: int = 20
) -> tuple[tuple[int, int], tuple[int, int], int, int]:
    """TFLite's ``PrepareGeneralSubOp``/``Add`` parameters for 8-bit inputs: input multipliers and shifts
    (each input's scale over twice the larger one) and the output's (twice the larger scale over
    2^left_shift · output_scale), all below one."""
    s1, s2, so = (np.float64(np.float32(s)) for s in (*scales, output_scale))
    twice_max = 2 * max(s1, s2)
    (m1,), (sh1,) = quantize_multiplier(s1 / twice_max)
    (m2,), (sh2,) = quantize_multiplier(s2 / twice_max)
    (mo,), (sho,) = quantize_multiplier(twice_max / ((1 << left_shift) * so))
    return (int(m1), int(m2)), (int(sh1), int(sh2)), int(mo), int(sho)
