"""Cross-layer equalization (Nagel et al., Data-Free Quantization, arXiv:1906.04721, section 4.1).

For each pair conv A -> ReLU -> conv B where A feeds only the ReLU and the ReLU only B, output channel i of A
is divided by s_i and input channel i of B multiplied by it (ReLU(x / s) = ReLU(x) / s for s > 0), with
s_i = sqrt(r_A,i * r_B,i) / r_B,i, where r are the channels' weight ranges (max |w|): both channels end with
the range sqrt(r_A,i * r_B,i). The FP32 function is unchanged; per-tensor weight grids waste less range.
ResNet8 has three such pairs (the first conv of each residual block and the next); convs feeding a residual
add or two consumers are left alone.
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
    """(conv A, conv B) pairs joined by a ReLU that nothing else reads, with constant weights, group 1."""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    inits = {init.name for init in model.graph.initializer}
    graph_outputs = {output.name for output in model.graph.output}

    def only_consumer(tensor: str, op_type: str) -> onnx.NodeProto | None:
        users = consumers.get(tensor, [])
        if tensor in graph_outputs or len(users) != 1 or users[0].op_type != op_type:
            return None
        return users[0]

    pairs = []
    for conv in model.graph.node:
        if conv.op_type != "Conv" or not _plain_conv(conv, inits):
            continue
        relu = only_consumer(conv.output[0], "Relu")
        following = relu and only_consumer(relu.output[0], "Conv")
        if following is not None and _plain_conv(following, inits) and following.input[0] == relu.output[0]:
            pairs.append((conv, following))
    return pairs


def _plain_conv(node: onnx.NodeProto, inits: set[str]) -> bool:
    group = next((a.i for a in node.attribute if a.name == "group"), 1)
    return group == 1 and all(name in inits for name in node.input[1:])


def equalize(model: onnx.ModelProto) -> list[str]:
    """Equalize every pair in place; returns the names of the pairs (``A -> B``)."""
    from onnx import numpy_helper

    from resnet8ptq.algorithms._graph import set_initializer

    inits = {init.name: init for init in model.graph.initializer}
    done = []
    for first, second in equalizable_pairs(model):
        w1 = numpy_helper.to_array(inits[first.input[1]]).astype(np.float64)
        w2 = numpy_helper.to_array(inits[second.input[1]]).astype(np.float64)
        r1 = np.abs(w1).reshape(w1.shape[0], -1).max(axis=1)
        r2 = np.abs(np.moveaxis(w2, 1, 0)).reshape(w2.shape[1], -1).max(axis=1)
        usable = (r1 > EPSILON) & (r2 > EPSILON)
        scale = np.where(usable, np.sqrt(r1 * r2) / np.where(usable, r2, 1.0), 1.0)
        set_initializer(inits[first.input[1]], w1 / scale[:, None, None, None])
        if len(first.input) > 2 and first.input[2]:
            set_initializer(inits[first.input[2]], numpy_helper.to_array(inits[first.input[2]]) / scale)
        set_initializer(inits[second.input[1]], w2 * scale[None, :, None, None])
        done.append(f"{first.name} -> {second.name}")
    return done
