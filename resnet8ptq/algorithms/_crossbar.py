"""The crossbar in the reconstruction loop (``algo.device_aware=true``): every conv/gemm of the simulated
model computed as the run's crossbar computes it (:mod:`resnet8ptq.device.cim`), differentiably, so that
block reconstruction (:mod:`._reconstruction`) learns the weights' rounding, the activations' steps and the
ADCs' steps against the chip's own partial sums.

Per layer, on the integers the device sees:

- the input, centred: the quantized activation over its (learned) step, x / s_x = q - zero point;
- the weights, centred: the soft-rounded weight over its grid's scale (w_q - zero point);
- **row tiles**: the C_in·kh·kw terms split as the device splits them
  (:func:`~resnet8ptq.device.mapping.tile_sizes`), one partial sum per tile and output column;
- **the ADC**: every partial sum p read as step · clamp(round(p / step), code_min, code_max), rounding with a
  straight-through gradient, so the step learns as LSQ learns a quantizer's (Esser et al. 2020): one step per
  layer, tile or column (``device.adc_granularity``), each a power of two or a fixed-point number
  (``device.adc_step``) in the forward pass, as the device holds it; the window of codes
  (``device.adc_window``) kept from the initial calibration;
- the tiles' readings added (with ``free`` steps rounded once to an integer, as the device's fixed-point
  sum; in float32 here, so a sum past 2^16 may round its last fraction bit differently), times s_x · s_w,
  plus the bias: the layer's output in float.

Each block's ADCs start from the ``mse`` rule (:func:`resnet8ptq.device.adc_ranges.calibrated_steps`) on the
partial sums of the block's input (the blocks before it already on their learned crossbar), read exactly, as
the device calibrates on its ideal crossbar.

**Noisy chips** (``algo.device_noise``): while a block learns, every iteration runs on a newly drawn chip,
its cells through the crossbar's own cell effects (:mod:`resnet8ptq.device.effects`, ``program`` then
``perturb``: programming noise, stuck cells, drift or charge loss at ``device.t_inference``), with the
layer's drift compensation (:func:`resnet8ptq.device.cells.drift_compensation`) where the crossbar has it: the
noise injection of aihwkit's hardware-aware training, here after training, on the learned rounding and steps.
The cells' change is added as a constant (the gradient reaches the weight as if the cell held it exactly).
The chips come from a generator of each layer's own (seeded from the calibration seed and the layer's
name), never from the chips the device evaluation draws (``torch.Generator().manual_seed(seed)``,
``device.noise_seeds``). Calibrating the ADCs and passing a learned block's output on run the ideal chip.

What the learning does not see: bit-serial inputs (``device.dac_bits`` < 8), weights sliced over several
cells, a clipping DAC (``device.coverage.check_learnable`` refuses those layouts), and the effects of a read
(read noise, IR drop) and of the ADCs (offset, gain, INL, noise), which are only evaluated.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from resnet8ptq.device.adc import STEP_FRACTION_BITS, Geometry, LayerSteps, PartialSumProfile
from resnet8ptq.device.adc_ranges import AdcRule, calibrated_steps
from resnet8ptq.device.cells import drift_compensation
from resnet8ptq.device.effects import Site, configured, on_the_chip
from resnet8ptq.device.mapping import tile_sizes

if TYPE_CHECKING:
    from collections.abc import Callable

    from resnet8ptq.algorithms._rounding import SoftRounding
    from resnet8ptq.device.config import Crossbar
    from resnet8ptq.simulation import LearnedStep

INITIAL_RULE = "mse"
"""The ADC range rule each learned step starts from."""


class _RoundSte(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return torch.round(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


def round_ste(x: torch.Tensor) -> torch.Tensor:
    """Round half to even, with a straight-through gradient (one autograd node)."""
    return _RoundSte.apply(x)


class CrossbarLayer(torch.nn.Module):
    """One conv/gemm node of the simulated model computed on the crossbar (module docstring). ``original``:
    the onnx2torch module (a ``Conv2d``/``Linear``, or a pad followed by one), its weight already the soft
    rounding's; ``rounding``: that soft rounding (its scale is the weight's); ``input_step``: the quantizer
    of the layer's input. Until :meth:`start` the ADC is exact, and with ``profile`` set every batch's partial
    sums are added to it. While :attr:`noisy`, every forward pass runs on a new chip drawn with ``crossbar``'s
    cell effects from ``seed`` (module docstring)."""

    def __init__(
        self,
        name: str,
        original: torch.nn.Module,
        rounding: SoftRounding,
        input_step: LearnedStep,
        crossbar: Crossbar,
        seed: int = 0,
    ) -> None:
        super().__init__()
        children = list(original) if isinstance(original, torch.nn.Sequential) else [original]
        *self.before, self.layer = children
        if (
            not isinstance(self.layer, torch.nn.Conv2d | torch.nn.Linear)
            or getattr(self.layer, "groups", 1) != 1
        ):
            raise RuntimeError(
                f"{name}: device-aware learning computes ungrouped Conv2d and Linear layers only."
            )
        self.name, self.input_step, self.crossbar = name, input_step, crossbar
        self.register_buffer("weight_scale", rounding.scale.reshape(-1))
        outputs, *rows = self.layer.weight.shape  # rows: (C_in, kh, kw), or (inputs,) for a Linear
        terms = int(np.prod(rows))
        bounds = np.cumsum([0, *tile_sizes(terms, crossbar.rows)])
        self.tiles = [(int(low), int(high)) for low, high in itertools.pairwise(bounds)]
        kernel = int(np.prod(rows[1:]))  # a channel's kh·kw terms (term order: c, kh, kw); 1 for a Linear
        self.channels = [slice(low // kernel, -(-high // kernel)) for low, high in self.tiles]
        for index, (low, high) in enumerate(self.tiles):  # each tile's rows, over the channels it touches
            mask = torch.zeros(terms)
            mask[low:high] = 1
            self.register_buffer(f"rows_{index}", mask.reshape(rows)[self.channels[index]])
        self.geometry = Geometry(len(self.tiles), 1, outputs)
        self.profile: PartialSumProfile | None = None
        self.log_step: torch.nn.Parameter | None = None
        self.frozen: torch.Tensor | None = None
        self.program, self.perturb = configured(crossbar, "program"), configured(crossbar, "perturb")
        self.site = Site(seed, name)
        self.chips = self.site.chip_generator("device-aware learning")
        self.noisy = False

    def start(self, steps: LayerSteps) -> None:
        """Put the ADCs at ``steps`` (the calibrated ones) and learn from there."""
        self.granularity = steps.granularity
        self.group_of_column = torch.from_numpy(steps.geometry.group_of_column(steps.granularity))
        self.log_step = torch.nn.Parameter(torch.from_numpy(np.log2(steps.steps)).float())
        self.offset = torch.nn.Parameter(torch.zeros(len(steps.steps)))
        self.offset.requires_grad_(self.crossbar.adc_window == "asymmetric")
        self.register_buffer("code_min", torch.from_numpy(steps.code_min.astype(np.float32)))
        self.register_buffer("code_max", torch.from_numpy(steps.code_max.astype(np.float32)))

    def parameters_to_learn(self) -> list[torch.nn.Parameter]:
        """The ADCs' steps and, for an asymmetric window, its position (in codes)."""
        return [self.log_step] + ([self.offset] if self.offset.requires_grad else [])

    def windows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Each group's first and last code: the calibrated window moved by the learned whole codes."""
        shift = self.frozen_shift if self.frozen is not None else round_ste(self.offset)
        return self.code_min + shift, self.code_max + shift

    def steps(self) -> torch.Tensor:
        """Each group's step as the device holds it: a power of two, or a multiple of 2^-8, at least one."""
        if self.frozen is not None:
            return self.frozen
        if self.crossbar.adc_step == "pow2":
            return torch.exp2(torch.clamp(round_ste(self.log_step), min=0))
        unit = 2.0**STEP_FRACTION_BITS
        return torch.clamp(round_ste(torch.exp2(self.log_step) * unit), min=unit) / unit

    def freeze(self) -> None:
        """Fix the steps and windows where they are."""
        self.frozen_shift = torch.round(self.offset).detach()
        self.frozen = self.steps().detach()
        self.log_step.requires_grad_(False)
        self.offset.requires_grad_(False)

    def learned(self, layer_key: str) -> LayerSteps:
        """The ADCs as the device evaluation takes them, for the layer of ``layer_key``
        (:func:`resnet8ptq.device.graph.weight_key` of its learned weights)."""
        steps = self.steps().detach().double().numpy()
        low, high = (codes.detach().numpy().astype(np.int64) for codes in self.windows())
        return LayerSteps(self.geometry, self.granularity, steps, low, high, layer_key)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        input_scale = self.input_step.scale()
        x = round_ste(x / input_scale)  # the centred input integers (QDrop's float elements rounded too)
        for module in self.before:
            x = module(x)
        shape = (-1,) + (1,) * (self.layer.weight.dim() - 1)
        weight = self.layer.weight / self.weight_scale.reshape(shape)  # centred weight integers
        compensation = None
        if self.noisy and (self.program or self.perturb):
            weight, compensation = self.on_a_new_chip(weight)
        partials = [self._partial(x, weight, tile) for tile in range(len(self.tiles))]
        if self.profile is not None:
            self.profile.add(self.name, self.geometry, torch.cat(partials, dim=1))
        if self.log_step is not None:
            partials = self._read(partials)
        accumulator = sum(partials)
        if compensation is not None:
            accumulator = accumulator * compensation  # the digital side scales the column sums
        if self.log_step is not None and (self.crossbar.adc_step == "free" or compensation is not None):
            accumulator = round_ste(accumulator)  # the device's fixed-point sum, rounded once to an integer
        scale = (input_scale * self.weight_scale).reshape((1, -1) + (1,) * (x.dim() - 2))
        out = accumulator * scale
        bias = self.layer.bias
        return out if bias is None else out + bias.reshape(scale.shape)

    def on_a_new_chip(self, weight: torch.Tensor) -> tuple[torch.Tensor, float | None]:
        """``weight`` (centred integers, one cell each: sign · level) as a newly drawn chip holds it: the
        ``program`` effects, then the ``perturb`` effects, as the device applies them
        (:meth:`resnet8ptq.device.cim.CrossbarArithmetic.weight_slices`), their change added as a constant;
        and the layer's drift compensation, if the crossbar has it (else ``None``)."""
        with torch.no_grad():
            cells = weight.detach().to(torch.float64).reshape(len(weight), -1)
            programmed, held = on_the_chip(
                cells, self.program, self.perturb, self.crossbar, self.chips, self.site
            )
            change = (held - cells).reshape(weight.shape).to(weight.dtype)
        compensation = (
            drift_compensation([programmed], [(held, 0)]) if self.crossbar.drift_compensation else None
        )
        return weight + change, compensation

    def _partial(self, x: torch.Tensor, weight: torch.Tensor, tile: int) -> torch.Tensor:
        """One row tile's partial sums: its terms of every output's dot product."""
        if isinstance(self.layer, torch.nn.Linear):
            low, high = self.tiles[tile]
            return x[:, low:high] @ weight[:, low:high].T
        channels, conv = self.channels[tile], self.layer
        rows = getattr(self, f"rows_{tile}")
        return F.conv2d(
            x[:, channels], weight[:, channels] * rows, None, conv.stride, conv.padding, conv.dilation
        )

    def _read(self, partials: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each tile's partial sums through its columns' ADCs."""
        column = self.group_of_column.reshape(len(self.tiles), -1)
        steps, low, high = (values[column] for values in (self.steps(), *self.windows()))
        read = []
        for tile, partial in enumerate(partials):
            shape = (1, -1) + (1,) * (partial.dim() - 2)
            bounds = low[tile].reshape(shape), high[tile].reshape(shape)
            read.append(AdcReading.apply(partial, steps[tile].reshape(shape), *bounds))
        return read


class AdcReading(torch.autograd.Function):
    """step · clamp(round(p / step), low, high) per column, with LSQ's gradients (Esser et al. 2020): to p,
    1 where the code is inside the window (round's straight-through estimate), else 0; to the step,
    round(p / step) - p / step inside the window, the window's end outside it; to each end of the window,
    the step where the reading saturates at it. One autograd node instead of a dozen elementwise ones, and
    only the gradients asked for: the window's ends get none unless it moves (``device.adc_window=
    asymmetric``). The window is a float mask, 1 inside and 0 outside (torch's boolean ``where`` and
    comparisons are several times slower on the CPU than a float pass), so the backward pass is two products
    and a sum."""

    @staticmethod
    def forward(ctx, partial, step, low, high):
        scaled = partial / step
        codes = torch.round(scaled)
        clamped = torch.minimum(torch.maximum(codes, low), high)
        # 1 inside the window, 0 outside: the codes are integers, so a clamped one moved by at least 1
        inside = (clamped - codes).abs_().clamp_(max=1).neg_().add_(1)
        step_gradient = None
        if ctx.needs_input_grad[1]:  # round(p / step) - p / step inside the window, its end outside it
            step_gradient = torch.addcmul(clamped, scaled, inside, value=-1)
        window = ctx.needs_input_grad[2] or ctx.needs_input_grad[3]
        ctx.save_for_backward(inside, step_gradient, step, *((codes, clamped) if window else ()))
        ctx.shapes = step.shape, low.shape, high.shape
        return clamped * step

    @staticmethod
    def backward(ctx, grad):
        inside, step_gradient, step, *window = ctx.saved_tensors
        grad_partial = grad * inside if ctx.needs_input_grad[0] else None
        grad_step = _reduced(grad * step_gradient, ctx.shapes[0]) if step_gradient is not None else None
        below = above = None
        if window:
            codes, clamped = window
            below = _reduced(grad * step * (codes < clamped), ctx.shapes[1])
            above = _reduced(grad * step * (codes > clamped), ctx.shapes[2])
        return grad_partial, grad_step, below, above


def _reduced(gradient: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """``gradient`` summed over the dimensions a parameter of ``shape`` was broadcast along."""
    return gradient.sum(dim=[d for d, size in enumerate(shape) if size == 1], keepdim=True)


def calibrate(layers: list[CrossbarLayer], run: Callable[[], object], crossbar: Crossbar) -> None:
    """Start ``layers``' ADCs from the ``mse`` rule on their partial sums, read exactly, while ``run()``
    computes their block on the calibration images."""
    profile = PartialSumProfile()
    for layer in layers:
        layer.profile = profile
    run()
    for layer in layers:
        layer.profile = None
    steps = calibrated_steps(profile, AdcRule.of(crossbar, INITIAL_RULE))
    for layer in layers:
        layer.start(steps[layer.name])
