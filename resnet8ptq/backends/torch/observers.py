"""PT2E observers that calibrate like ONNX Runtime: ORT's range algorithms, scale/zero-point formula and
weight symmetry rule, so that both backends quantize with the same parameters."""

from __future__ import annotations

from typing import Any

import torch
from torch import fx
from torchao.quantization.pt2e.observer import UniformQuantizationObserverBase

from resnet8ptq.calibration import CalibConfig, RangeCollector
from resnet8ptq.dtype import ort_scale_zero_point

TORCH_DTYPES = {"int8": torch.int8, "uint8": torch.uint8, "int16": torch.int16, "uint16": torch.uint16}
"""The storage types of :attr:`resnet8ptq.dtype.DtypeConfig.storage`."""


class OrtActivationObserver(UniformQuantizationObserverBase):
    """Per-tensor affine activation observer whose range is computed by :class:`RangeCollector` (for
    ``calib=mse`` fitted to the observer's own integer range)."""

    def __init__(
        self, calib: CalibConfig, dtype: torch.dtype, quant_min: int, quant_max: int, **kwargs: Any
    ) -> None:
        # The range: DtypeConfig.activation_range (asymmetric, as ORT's ActivationSymmetric default).
        kwargs.update(quant_min=quant_min, quant_max=quant_max, qscheme=torch.per_tensor_affine)
        kwargs.pop("ch_axis", None)
        super().__init__(dtype=dtype, **kwargs)
        self.collector = RangeCollector(calib)
        self._range: tuple[float, float] | None = None
        self._fixed: tuple[float, float] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._fixed is None:
            self.collector.add(x.detach().float().cpu().numpy())
            self._range = None
        return x

    def fix_range(self, low: float, high: float) -> None:
        """Use ``(low, high)`` (a learned range) instead of calibrating."""
        self._fixed = self._range = (low, high)

    def compute_range(self) -> tuple[float, float]:
        """The calibrated (min, max) of the observed tensor (computed once, then cached), or the fixed one."""
        if self._range is None:
            self._range = self.collector.compute((self.quant_min, self.quant_max))
        return self._range

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        scale, zero_point = ort_scale_zero_point(
            *self.compute_range(), self.quant_min, self.quant_max, symmetric=False
        )
        return torch.tensor([scale], dtype=torch.float32), torch.tensor([zero_point], dtype=torch.int64)


class OrtWeightObserver(UniformQuantizationObserverBase):
    """Weight observer, per tensor or per channel (``ch_axis``), with ORT's symmetry rule, over the weight's
    min/max or its MSE clipping (``method``: ``calib.weights``, the ONNX backend's
    :func:`resnet8ptq.weight_grid.weight_range`); the integer range (any width, ``reduce_range``) comes from
    :meth:`DtypeConfig.weight_range`."""

    def __init__(
        self,
        dtype: torch.dtype,
        quant_min: int,
        quant_max: int,
        symmetric: bool,
        per_channel: bool = False,
        ch_axis: int = 0,
        method: str = "minmax",
        **kwargs: Any,
    ) -> None:
        kwargs.update(quant_min=quant_min, quant_max=quant_max)
        # Per-tensor weights are stored as per-channel vectors repeating one scale/zero point: the same
        # numbers, in the form inductor's x86 int8 conv/linear lowering matches (it needs per-channel ops).
        kwargs["qscheme"] = torch.per_channel_symmetric if symmetric else torch.per_channel_affine
        super().__init__(dtype=dtype, **kwargs)
        self.symmetric = symmetric
        self.per_channel = per_channel
        self.ch_axis = ch_axis
        self.method = method
        self.min_val: torch.Tensor | None = None
        self.max_val: torch.Tensor | None = None

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        from resnet8ptq.weight_grid import weight_range

        values = w.detach().float()
        channels = values.shape[self.ch_axis]
        slices = values.transpose(0, self.ch_axis).flatten(1) if self.per_channel else values.reshape(1, -1)
        qrange = (self.quant_min, self.quant_max)
        ranges = [weight_range(s.numpy(), qrange, self.symmetric, self.method) for s in slices]
        low, high = (torch.tensor(ends, dtype=torch.float32) for ends in zip(*ranges, strict=True))
        if not self.per_channel:
            low, high = low.expand(channels), high.expand(channels)
        self.min_val, self.max_val = low, high
        return w

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.min_val is None or self.max_val is None:
            raise RuntimeError("The weight observer never saw its weight; run calibration first.")
        pairs = [
            ort_scale_zero_point(lo, hi, self.quant_min, self.quant_max, self.symmetric)
            for lo, hi in zip(self.min_val.tolist(), self.max_val.tolist(), strict=True)
        ]
        scales = torch.tensor([p[0] for p in pairs], dtype=torch.float32)
        zero_points = torch.tensor([p[1] for p in pairs], dtype=torch.int64)
        return scales, zero_points


class SharedObserver(UniformQuantizationObserverBase):
    """A second use of a shared observer (e.g. an average pool's output, which takes its input's
    parameters, like ORT's QDQDirect8BitOp): it passes values through and defers to the first use, so
    the shared range is calibrated on the first tensor only, as ORT calibrates it."""

    def __init__(self, primary: OrtActivationObserver) -> None:
        super().__init__(
            dtype=primary.dtype,
            qscheme=primary.qscheme,
            quant_min=primary.quant_min,
            quant_max=primary.quant_max,
        )
        self._primary = (primary,)  # a tuple, so the primary is not registered as a child module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._primary[0].calculate_qparams()


def split_shared_observers(prepared: fx.GraphModule) -> int:
    """Give every use of a shared activation observer but the first a :class:`SharedObserver`."""
    first_use: dict[int, str] = {}
    split = 0
    for node in prepared.graph.nodes:
        if node.op != "call_module":
            continue
        module = prepared.get_submodule(node.target)
        if not isinstance(module, OrtActivationObserver):
            continue
        if id(module) in first_use:
            setattr(prepared, node.target, SharedObserver(module))
            split += 1
        else:
            first_use[id(module)] = node.target
    return split
