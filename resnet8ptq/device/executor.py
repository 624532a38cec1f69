"""Run an :class:`~resnet8ptq.device.graph.IntegerModel` on integers only, vectorized in torch.

Every tensor between layers holds int8/uint8 values (NCHW). They are stored as float32, which holds such
integers exactly, so that convolutions run on torch's fast float kernels: a sum of integer products is exact
in floating point while every partial sum stays below 2^24 (float32) or 2^53 (float64), and
:func:`exact_dtype` picks the type from each layer's worst case. Convolutions and dense layers hand their
centred integer input to an :class:`Arithmetic` (the device: :class:`Ideal` here, the compute-in-memory model
in :mod:`.cim`), which returns the integer accumulators; requantization, adds and pooling are the fixed-point
integer operations of TFLite's reference kernels (:mod:`.fixed_point`), bit for bit
(:func:`requantize_exact`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from resnet8ptq.device.fixed_point import (
    ROUNDINGS,
    effective_scale,
    multiply_by_quantized_multiplier_single_rounding,
)
from resnet8ptq.device.graph import (
    RESIDUAL_FRACTION_BITS,
    Add,
    AveragePool,
    Conv,
    IntegerModel,
    Layer,
    MaxPool,
)

EXACT_FLOAT32 = 2**24
"""Integers up to 2^24 are exact in float32: a sum whose every partial sum stays below it is exact."""


class Arithmetic:
    """How a device computes a conv/dense layer's accumulators from its centred integer input."""

    def accumulate(self, layer: Conv, x: torch.Tensor) -> torch.Tensor:
        """acc = Σ (x - x_zp)(w - w_zp) over each output's C_in·kh·kw terms, bias not included, as an
        integer-valued float tensor (N, O, H', W'). ``x`` is x - x_zp, integer-valued float32 (N, C, H, W)."""
        raise NotImplementedError

    def start_batch(self, first_image: int, images: int) -> None:
        """The next layers' inputs are the run's images ``first_image`` .. ``first_image + images - 1`` (a
        device whose reads draw noise draws it per image; others ignore it)."""


def exact_dtype(weight: np.ndarray, input_bound: int, extra: int = 0) -> torch.dtype:
    """float32 when no partial sum of any output can reach 2^24 (Σ|w| · max|x| + ``extra`` below it, so every
    order of summation is exact), else float64."""
    largest = int(np.abs(weight.astype(np.int64)).reshape(len(weight), -1).sum(axis=1).max()) * input_bound
    return torch.float32 if largest + extra < EXACT_FLOAT32 else torch.float64


def integer_conv2d(
    x: torch.Tensor,
    weight: torch.Tensor,
    stride: tuple[int, int] | int,
    gemm: bool | None = None,
    groups: int = 1,
) -> torch.Tensor:
    """An unpadded convolution of integer-valued floats, exact while every partial sum stays below the
    type's integer limit (:func:`exact_dtype`). On the CPU, torch's convolution (oneDNN's direct algorithm);
    with ``gemm`` (the default on CUDA, where cuDNN may pick Winograd or FFT kernels, which are not exact) an
    im2col matrix product in C_in-major (c, kh, kw) order with TF32 off, group by group."""
    if not (x.is_cuda if gemm is None else gemm):
        return F.conv2d(x, weight, stride=stride, groups=groups)
    kernel, (height, width) = weight.shape[2:], x.shape[2:]
    stride = (stride, stride) if isinstance(stride, int) else tuple(stride)
    columns = F.unfold(x, kernel, stride=stride)  # (N, C·kh·kw, L), channel-major
    columns = columns.reshape(len(x), groups, -1, columns.shape[-1])  # (N, G, C/G·kh·kw, L)
    out = (height - kernel[0]) // stride[0] + 1, (width - kernel[1]) // stride[1] + 1
    with exact_matmul():
        product = weight.reshape(groups, len(weight) // groups, -1) @ columns  # (N, G, O/G, L)
    return product.reshape(len(x), len(weight), *out)


def stacked_conv2d(
    x: torch.Tensor, weight: torch.Tensor, stride: tuple[int, int] | int, groups: int, outputs: int
) -> torch.Tensor:
    """:func:`integer_conv2d` of a layer's ``groups``-grouped convolution whose ``outputs`` channels are
    stacked S times on ``weight``'s outputs (S·O, C/groups, kh, kw; stack-major, as a crossbar stacks a
    layer's weight slices): each stack convolved group by group, the result (N, S·O, H', W') in ``weight``'s
    order. One convolution, its outputs reordered group-major (a grouped convolution reads group j // (S·O /
    groups))."""
    if groups == 1:
        return integer_conv2d(x, weight, stride)
    stacks, per_group = len(weight) // outputs, outputs // groups
    rest = weight.shape[1:]
    grouped = weight.reshape(stacks, groups, per_group, *rest).transpose(0, 1).reshape(len(weight), *rest)
    out = integer_conv2d(x, grouped, stride, groups=groups)
    size = out.shape[2:]
    return out.reshape(len(x), groups, stacks, per_group, *size).transpose(1, 2).reshape(len(x), -1, *size)


@contextmanager
def exact_matmul() -> Iterator[None]:
    """TF32 off for CUDA matrix products while inside (torch's default, kept against a changed global)."""
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


def zero_pad(layer: Conv, x: torch.Tensor) -> torch.Tensor:
    """The centred input padded as the layer pads (``padding``: top, bottom, left, right) with zeros: the
    input zero point, centred."""
    top, bottom, left, right = layer.padding
    return F.pad(x, (left, right, top, bottom))


def float_conv(
    layer: Conv, x: torch.Tensor, weight: np.ndarray | torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """The integer convolution of ``x`` (centred) with integer ``weight`` (O, I, kh, kw), in ``dtype`` (exact:
    :func:`exact_dtype`), on ``x``'s device; zero padding, as the centred input's zero point is 0."""
    padded = zero_pad(layer, x.to(dtype))
    if isinstance(weight, np.ndarray):
        weight = torch.from_numpy(np.ascontiguousarray(weight))
    return integer_conv2d(padded, weight.to(dtype=dtype, device=x.device), layer.stride, groups=layer.groups)


def input_bound(layer: Conv) -> int:
    """The largest |x - x_zp| the layer's input type allows."""
    q = layer.input_quant
    return max(q.qmax - q.zero_point, q.zero_point - q.qmin)


class Ideal(Arithmetic):
    """The ideal integer device: exact accumulators (int32 is never exceeded by this network's sums)."""

    def accumulate(self, layer: Conv, x: torch.Tensor) -> torch.Tensor:
        weight = layer.centered_weight
        dtype = exact_dtype(weight, input_bound(layer), int(np.abs(layer.bias).max()))
        return float_conv(layer, x, weight, dtype)


def per_channel(
    values: np.ndarray, dtype: torch.dtype = torch.int64, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """(O,) parameters shaped to broadcast over NCHW."""
    return torch.from_numpy(np.asarray(values)).to(dtype=dtype, device=device).reshape(1, -1, 1, 1)


def requantize_exact(
    acc: torch.Tensor,
    multiplier: np.ndarray,
    shift: np.ndarray,
    zero_point: int,
    low: int,
    high: int,
    rounding: str = "double",
) -> torch.Tensor:
    """clamp(MBQM(acc, multiplier, shift) + zero_point, low, high) per channel (dim 1), bit for bit, fast.

    ``acc`` is an integer-valued float tensor. The result is rounded in floating point from v = acc · scale,
    which equals TFLite's fixed-point result except where v lies near a half-integer: within the float error
    (|v| · 2^-23 in float32; only |v| below ``2 · (high - low)`` matters, beyond it the clamp decides), and
    for the ``double`` rounding within 2^-(right shift + 1), where the first rounding can carry it across.
    Those few values are recomputed with the exact int64 arithmetic
    (:data:`~resnet8ptq.device.fixed_point.ROUNDINGS`)."""
    multiplier = np.broadcast_to(np.asarray(multiplier, np.int64), (acc.shape[1],))
    shift = np.broadcast_to(np.asarray(shift, np.int64), (acc.shape[1],))
    dtype = acc.dtype
    relevant = 2.0 * (high - low + abs(zero_point)) + 2
    band = np.full(len(shift), relevant * 2.0 ** (-22 if dtype == torch.float32 else -50))
    if rounding == "double":
        band += np.exp2(-(np.maximum(-shift, 0) + 1.0))
    estimate = acc * per_channel(effective_scale(multiplier, shift), dtype, acc.device)
    rounded = torch.round(estimate)
    estimate -= rounded  # now the rounding's residual, in [-0.5, 0.5]
    uncertain = estimate.abs_() >= per_channel(0.5 - band, dtype, acc.device)
    if bool(uncertain.any()):
        index = uncertain.nonzero(as_tuple=True)
        channel = index[1]
        exact = ROUNDINGS[rounding](
            acc[index].to(torch.int64),
            torch.from_numpy(multiplier.copy()).to(acc.device)[channel],
            torch.from_numpy(shift.copy()).to(acc.device)[channel],
        )
        rounded[index] = exact.to(dtype)
    return (rounded + zero_point).clamp_(low, high).to(torch.float32)


def requantize(layer: Conv, acc: torch.Tensor) -> torch.Tensor:
    """The accumulator (bias included) requantized to the output type: MBQM + zero point, clamped."""
    return requantize_exact(
        acc,
        layer.multiplier,
        layer.shift,
        layer.output_quant.zero_point,
        layer.act_min,
        layer.act_max,
        layer.rounding,
    )


def requantize_residual(layer: Conv, acc: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """A fused conv + add (:class:`~resnet8ptq.device.graph.Residual`), in exact int64 arithmetic."""
    res = layer.residual
    fraction = RESIDUAL_FRACTION_BITS
    conv_term = multiply_by_quantized_multiplier_single_rounding(
        acc.to(torch.int64),
        per_channel(layer.multiplier, device=acc.device),
        per_channel(layer.shift, device=acc.device),
    )
    values = np.arange(res.quant.qmin, res.quant.qmax + 1, dtype=np.int64)
    table = multiply_by_quantized_multiplier_single_rounding(
        values - res.quant.zero_point, res.multiplier, res.shift
    )
    residual_term = torch.from_numpy(table).to(acc.device)[(residual - res.quant.qmin).to(torch.int64)]
    out = (conv_term + residual_term + (1 << (fraction - 1))) >> fraction
    return (out + layer.output_quant.zero_point).clamp_(layer.act_min, layer.act_max).to(torch.float32)


def add(layer: Add, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """TFLite's integer add (reference ``AddElementwise``): each input's rescaling is a table over its 256
    integer values, their sum (int64, exact in float64) requantized to the output. That arithmetic is done
    once on the grid of every pair of input integers (256 × 256: far fewer than a batch's elements), and
    each output read from the table at (a, b)."""
    rescaled = []
    for q, multiplier, shift in zip(
        layer.input_quants, layer.input_multipliers, layer.input_shifts, strict=True
    ):
        values = np.arange(q.qmin, q.qmax + 1, dtype=np.int64)
        rescaled.append(
            ROUNDINGS[layer.rounding]((values - q.zero_point) << layer.left_shift, multiplier, shift)
        )
    total = (rescaled[0][:, None] + rescaled[1][None, :]).astype(np.float64)
    table = requantize_exact(
        torch.from_numpy(total).reshape(1, 1, *total.shape),
        np.array([layer.output_multiplier]),
        np.array([layer.output_shift]),
        layer.output_quant.zero_point,
        layer.act_min,
        layer.act_max,
        layer.rounding,
    ).reshape(-1)
    first, second = layer.input_quants
    index = (a - first.qmin) * total.shape[1] + (b - second.qmin)  # exact in float32: below 2^16
    return table.to(a.device)[index.to(torch.int64)]


def average_pool(layer: AveragePool, x: torch.Tensor) -> torch.Tensor:
    """Global average pool: the window sum divided with rounding (TFLite: half away from zero; a QDQ model's:
    half to even), or the sum requantized."""
    count = x.shape[2] * x.shape[3]
    q_in, q_out = layer.input_quant, layer.output_quant
    if layer.rounding_divide:
        total = x.to(torch.int64).sum(dim=(2, 3), keepdim=True)
        if layer.half_to_even:
            quotient = torch.div(total, count, rounding_mode="floor")
            twice_rest = 2 * (total - quotient * count)
            out = quotient + ((twice_rest > count) | ((twice_rest == count) & (quotient % 2 == 1)))
        else:
            magnitude = (total.abs() + count // 2) // count  # C's (acc ± count/2) / count, toward zero
            out = torch.where(total >= 0, magnitude, -magnitude)
        return out.clamp(q_out.qmin, q_out.qmax).to(torch.float32)
    total = (x.to(torch.float64) - q_in.zero_point).sum(dim=(2, 3), keepdim=True)
    return requantize_exact(
        total, np.array([layer.multiplier]), np.array([layer.shift]), q_out.zero_point, q_out.qmin, q_out.qmax
    )


def max_pool(layer: MaxPool, x: torch.Tensor) -> torch.Tensor:
    """Each window's largest integer (exact in float), padded positions below every integer, then the
    fused activation's clamp."""
    top, bottom, left, right = layer.padding
    padded = F.pad(x, (left, right, top, bottom), value=-math.inf) if any(layer.padding) else x
    out = F.max_pool2d(padded, layer.kernel, layer.stride)
    q = layer.output_quant
    low = q.qmin if layer.act_min is None else layer.act_min
    high = q.qmax if layer.act_max is None else layer.act_max
    return out.clamp(low, high)


def quantize_input(model: IntegerModel, images: np.ndarray) -> torch.Tensor:
    """NHWC float32 images (or (N, features) vectors, as (N, features, 1, 1)) as the model's quantized input,
    NCHW (integer values in float32): x / scale in float32, rounded as the source runtime rounds (TFLite: half
    away from zero; ONNX/torch QuantizeLinear: half to even)."""
    q = model.input_quant
    values = torch.from_numpy(np.ascontiguousarray(images, np.float32))
    if values.dim() == 2:
        values = values.reshape(*values.shape, 1, 1)
    elif values.dim() == 4:
        values = values.permute(0, 3, 1, 2)
    else:
        raise ValueError(f"inputs of shape {tuple(images.shape)}: expected NHWC images or (N, features).")
    scaled = values / np.float32(q.scale)
    if model.input_rounding == "half_away_from_zero":
        rounded = torch.sign(scaled) * torch.floor(scaled.abs() + 0.5)
    else:
        rounded = torch.round(scaled)  # half to even
    return (rounded + q.zero_point).clamp_(q.qmin, q.qmax)


@dataclass
class Trace:
    """What :func:`execute` keeps besides the logits: every layer's output and the conv/dense accumulators
    (bias included), for the first images of the batch."""

    outputs: dict[str, torch.Tensor] = field(default_factory=dict)
    accumulators: dict[str, torch.Tensor] = field(default_factory=dict)


def run_layer(layer: Layer, tensors: dict[str, torch.Tensor], arithmetic: Arithmetic) -> torch.Tensor:
    """One layer's output from the tensors computed so far; accumulators go to ``tensors['acc:' + name]``."""
    if isinstance(layer, Conv):
        x = tensors[layer.input]
        if layer.dense and x.dim() == 4:
            if x.shape[2:] != (1, 1):
                raise ValueError(f"{layer.name}: a dense layer needs a 1x1 input, got {tuple(x.shape)}.")
        elif layer.dense:
            x = x.reshape(*x.shape, 1, 1)
        acc = arithmetic.accumulate(layer, x - layer.input_quant.zero_point)
        acc += per_channel(layer.bias, acc.dtype, acc.device)
        tensors["acc:" + layer.name] = acc
        if layer.residual is not None:
            return requantize_residual(layer, acc, tensors[layer.residual.tensor])
        if layer.output_quant is None:
            return acc  # the accumulator is the output (logits left in float by the toolchain)
        return requantize(layer, acc)
    if isinstance(layer, Add):
        return add(layer, tensors[layer.inputs[0]], tensors[layer.inputs[1]])
    if isinstance(layer, AveragePool):
        return average_pool(layer, tensors[layer.input])
    if isinstance(layer, MaxPool):
        return max_pool(layer, tensors[layer.input])
    raise TypeError(f"Unknown layer {layer!r}")


def compute_device() -> torch.device:
    """Where the integer model runs: the first CUDA GPU torch sees, else the CPU (the results are the same
    integers on both: every kernel is exact, :func:`integer_conv2d`)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def execute(
    model: IntegerModel,
    images: np.ndarray,
    arithmetic: Arithmetic | None = None,
    batch_size: int = 500,
    trace_images: int = 0,
    progress: Callable[[int], None] | None = None,
    device: torch.device | str | None = None,
) -> tuple[np.ndarray, Trace]:
    """The model's int logits (N, classes) for NHWC float32 ``images`` on ``arithmetic`` (default
    :class:`Ideal`), batch by batch, computed on ``device`` (default: :func:`compute_device`) and returned
    on the CPU; with ``trace_images``, every layer's output and accumulators for the first that many images.
    ``progress`` is called with each batch's size."""
    arithmetic = arithmetic or Ideal()
    device = compute_device() if device is None else device
    if trace_images > batch_size:
        raise ValueError(f"trace_images={trace_images} must fit in one batch ({batch_size}).")
    logits, trace = [], Trace()
    with torch.inference_mode():
        for start in range(0, len(images), batch_size):
            tensors = {model.input: quantize_input(model, images[start : start + batch_size]).to(device)}
            arithmetic.start_batch(start, len(tensors[model.input]))
            for layer in model.layers:
                tensors[layer.output] = run_layer(layer, tensors, arithmetic)
            keep = trace_images - start
            if keep > 0:
                for layer in model.layers:
                    trace.outputs.setdefault(model.input, tensors[model.input][:keep].to(torch.int64).cpu())
                    trace.outputs[layer.output] = tensors[layer.output][:keep].to(torch.int64).cpu()
                    if isinstance(layer, Conv):
                        acc = tensors["acc:" + layer.name][:keep]
                        trace.accumulators[layer.name] = acc.to(torch.int64).cpu()
            last = tensors[model.output]
            logits.append(last.reshape(len(last), -1).to(torch.int64).cpu().numpy())
            if progress:
                progress(len(tensors[model.output]))
    return np.concatenate(logits), trace
