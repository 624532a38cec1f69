"""Cross-layer equalization (Nagel et al., Data-Free Quantization, arXiv:1906.04721, section 4.1).

For each pair A -> ReLU -> B of convolutions or dense layers (Gemm), where A feeds only the ReLU and the ReLU
only B, output channel i of A is divided by s_i and input channel i of B multiplied by it (ReLU(x / s) =
ReLU(x) / s for s > 0), with s_i = sqrt(r_A,i * r_B,i) / r_B,i, where r are the channels' weight ranges
(max |w|): both channels end with the range sqrt(r_A,i * r_B,i). The FP32 function is unchanged; per-tensor
weight grids waste less range. ResNet8 has three such pairs (the first conv of each residual block and the
next); convs feeding a residual add or two consumers are left alone, and so is a ReLU6 (``Clip``), which
scaling does not commute with. A depthwise convolution is a pair's A as any convolution is (its output
channel i is its kernel i) and its B with input channel i its kernel i: the depthwise-separable blocks the
paper equalizes (MobileNet); a dense chain (MLPerf Tiny's autoencoder) pairs along the Gemm's weight axes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from resnet8ptq.algorithms.base import Algorithm, Context

if TYPE_CHECKING:
    import onnx

EPSILON = 1e-12  # channels whose weights are all zero keep their scale (s = 1)


class CrossLayerEqualization(Algorithm):
    """``cle``: first, so that the rounding and the bias correction after it see the equalized weights."""

    NAME = "cle"
    STAGE = 10

    def apply(self, model: onnx.ModelProto, context: Context) -> dict[str, str]:
        return {"cle_pairs": "; ".join(equalize(model)) or "none found"}


def equalizable_pairs(model: onnx.ModelProto) -> list[tuple[onnx.NodeProto, onnx.NodeProto]]:
    """(layer A, layer B) pairs joined by a ReLU that nothing else reads, with constant weights: A a Conv
    (any groups) or a Gemm, B a Conv of one group or a depthwise one, or a Gemm."""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    inits = {init.name: init for init in model.graph.initializer}
    graph_outputs = {output.name for output in model.graph.output}

    def only_consumer(tensor: str, op_types: tuple[str, ...]) -> onnx.NodeProto | None:
        users = consumers.get(tensor, [])
        if tensor in graph_outputs or len(users) != 1 or users[0].op_type not in op_types:
            return None
        return users[0]

    pairs = []
    for layer in model.graph.node:
        if layer.op_type not in ("Conv", "Gemm") or _axes(layer, inits) is None:
            continue
        relu = only_consumer(layer.output[0], ("Relu",))
        following = relu and only_consumer(relu.output[0], ("Conv", "Gemm"))
        if following is None or following.input[0] != relu.output[0] or _axes(following, inits) is None:
            continue
        if _axes(layer, inits)[0] is not None and _axes(following, inits)[1] is not None:
            pairs.append((layer, following))
    return pairs


def _axes(node: onnx.NodeProto, inits: dict[str, onnx.TensorProto]) -> tuple[int | None, int | None] | None:
    """The weight's (output-channel axis, input-channel axis) of a layer with constant weights and bias (None
    where a channel has no axis of its own: a grouped, not depthwise, convolution's inputs); None for a
    layer CLE leaves alone (a Gemm that scales or transposes its input)."""
    if not all(name in inits for name in node.input[1:] if name):
        return None
    attributes = {a.name: a for a in node.attribute}
    if node.op_type == "Gemm":
        if any(attributes[k].f != 1.0 for k in ("alpha", "beta") if k in attributes) or (
            "transA" in attributes and attributes["transA"].i
        ):
            return None
        trans_b = "transB" in attributes and attributes["transB"].i
        return (0, 1) if trans_b else (1, 0)
    group = attributes["group"].i if "group" in attributes else 1
    depthwise = group > 1 and list(inits[node.input[1]].dims)[:2] == [group, 1]
    return 0, (0 if depthwise else 1 if group == 1 else None)


def _ranges(weight: np.ndarray, axis: int) -> np.ndarray:
    """Each channel's weight range (max |w|) along ``axis``."""
    return np.abs(np.moveaxis(weight, axis, 0)).reshape(weight.shape[axis], -1).max(axis=1)


def _along(factor: np.ndarray, axis: int, ndim: int) -> np.ndarray:
    """``factor`` shaped to broadcast along ``axis`` of an ``ndim``-dimensional weight."""
    shape = [1] * ndim
    shape[axis] = -1
    return factor.reshape(shape)


def equalize(model: onnx.ModelProto) -> list[str]:
    """Equalize every pair in place; returns the names of the pairs (``A -> B``)."""
    from onnx import numpy_helper

    from resnet8ptq.algorithms._graph import set_initializer

    inits = {init.name: init for init in model.graph.initializer}
    done = []
    for first, second in equalizable_pairs(model):
        out_axis, in_axis = _axes(first, inits)[0], _axes(second, inits)[1]
        w1 = numpy_helper.to_array(inits[first.input[1]]).astype(np.float64)
        w2 = numpy_helper.to_array(inits[second.input[1]]).astype(np.float64)
        r1, r2 = _ranges(w1, out_axis), _ranges(w2, in_axis)
        has_bias = len(first.input) > 2 and bool(first.input[2])
        bias = numpy_helper.to_array(inits[first.input[2]]) if has_bias else None
        if len(r1) != len(r2) or (bias is not None and bias.shape != r1.shape):  # a broadcast bias: left
            continue
        usable = (r1 > EPSILON) & (r2 > EPSILON)
        scale = np.where(usable, np.sqrt(r1 * r2) / np.where(usable, r2, 1.0), 1.0)
        set_initializer(inits[first.input[1]], w1 / _along(scale, out_axis, w1.ndim))
        if bias is not None:
            set_initializer(inits[first.input[2]], bias / scale)
        set_initializer(inits[second.input[1]], w2 * _along(scale, in_axis, w2.ndim))
        done.append(f"{first.name} -> {second.name}")
    return done
