"""The integer grid every backend puts a conv/gemm weight on, computed without a backend: ORT's scale and
zero point (``compute_scale_zp`` on the weight's min/max, per tensor or per output channel) in the integer
range of :class:`~resnet8ptq.dtype.DtypeConfig`, and ORT's rounding (half to even) and clipping. The ONNX
backend hands these parameters to ORT for weights narrower than 8 bits; the PTQ algorithms use them to see
the weights as the backends will quantize them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from resnet8ptq.spec import QuantSpec

WEIGHT_INPUTS = {"Conv": 1, "Gemm": 1, "MatMul": 1}
"""Op type -> the input that holds the weight the backends quantize."""


@dataclass(frozen=True)
class WeightGrid:
    """Scale and zero point of each output channel (one entry if per tensor), along ``axis``."""

    scale: np.ndarray  # float32
    zero_point: np.ndarray  # int32
    axis: int
    qmin: int
    qmax: int

    def _shape(self, ndim: int) -> list[int]:
        shape = [1] * ndim
        shape[self.axis] = -1
        return shape

    def quantize(self, weight: np.ndarray) -> np.ndarray:
        """The integers ORT stores: round(w / scale) + zero point, clipped to [qmin, qmax] (int32)."""
        scale = self.scale.reshape(self._shape(weight.ndim))
        zero_point = self.zero_point.reshape(self._shape(weight.ndim))
        return np.clip(np.round(weight / scale) + zero_point, self.qmin, self.qmax).astype(np.int32)

    def dequantize(self, integers: np.ndarray) -> np.ndarray:
        """(q - zero point) * scale, as float32."""
        scale = self.scale.reshape(self._shape(integers.ndim))
        zero_point = self.zero_point.reshape(self._shape(integers.ndim))
        return ((integers - zero_point) * scale).astype(np.float32)

    def fake_quantize(self, weight: np.ndarray) -> np.ndarray:
        """The float weight the quantized model computes with."""
        return self.dequantize(self.quantize(weight))


def channel_axis(node: onnx.NodeProto) -> int:
    """The weight axis ORT quantizes per channel: output channels (Conv: 0; Gemm: 1, or 0 with transB)."""
    if node.op_type == "Gemm":
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        return 0 if trans_b else 1
    return 0 if node.op_type == "Conv" else 1


def weight_grid(weight: np.ndarray, axis: int, spec: QuantSpec, bits: int | None = None) -> WeightGrid:
    """The grid ``spec`` puts ``weight`` on (``axis``: its output-channel axis; ``bits``: the layer's own
    width, :func:`resnet8ptq.layers.weight_widths`, else ``dtype.weight_bits``)."""
    from onnxruntime.quantization.quant_utils import compute_scale_zp

    symmetric = spec.dtype.weight_symmetric(spec.per_channel)
    qmin, qmax = spec.dtype.weight_range(symmetric, spec.reduce_range, bits)
    slices = np.moveaxis(weight, axis, 0) if spec.per_channel else weight[np.newaxis]
    scales, zero_points = [], []
    for values in slices:
        low, high = weight_range(values, (qmin, qmax), symmetric, spec.calib.weights)
        zero_point, scale = compute_scale_zp(
            np.array(low, np.float32),
            np.array(high, np.float32),
            np.array(qmin, np.int32),
            np.array(qmax, np.int32),
            symmetric,
        )
        scales.append(np.float32(scale))
        zero_points.append(int(zero_point))
    return WeightGrid(
        np.array(scales, np.float32),
        np.array(zero_points, np.int32),
        axis if spec.per_channel else 0,
        qmin,
        qmax,
    )


def weight_range(
    values: np.ndarray, qrange: tuple[int, int], symmetric: bool, method: str
) -> tuple[float, float]:
    """The range one weight (or output channel) is quantized over: its min and max, or for ``mse``
    (``calib.weights``) the clipping with the least squared error
    (:func:`resnet8ptq.calibration.mse_weight_range`)."""
    if method == "mse":
        from resnet8ptq.calibration import mse_weight_range

        return mse_weight_range(values, qrange, symmetric)
    return float(values.min()), float(values.max())


def quantized_weights(model: onnx.ModelProto) -> dict[str, tuple[onnx.NodeProto, np.ndarray]]:
    """The conv/gemm weights the backends quantize: initializer name -> (the node using it, its values)."""
    inits = {init.name: init for init in model.graph.initializer}
    weights = {}
    for node in model.graph.node:
        index = WEIGHT_INPUTS.get(node.op_type)
        if index is not None and len(node.input) > index and node.input[index] in inits:
            weights[node.input[index]] = (
                node,
                numpy_helper.to_array(inits[node.input[index]]).astype(np.float32),
            )
    return weights
