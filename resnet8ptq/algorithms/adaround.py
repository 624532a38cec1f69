"""AdaRound (Nagel et al., Up or Down? Adaptive Rounding for Post-Training Quantization, arXiv:2004.10568).

Each conv/gemm weight is put on the grid the backends will use (:mod:`resnet8ptq.weight_grid`), but instead
of rounding to nearest, every element learns whether to round up or down so that the layer's output on the
calibration sample changes least: a rectified-sigmoid soft rounding h(V) is fitted with Adam to minimise
||W x - W~ x||^2 plus a regulariser that anneals h towards 0 or 1 (the paper's section 4 and appendix;
:mod:`._rounding`: beta from 20 to 2, lambda 0.01, the first 20% of iterations without it). Layer inputs
come from the FP32 model. The result is written back as float weights that lie exactly on the grid; the
elements that define each channel's range (its smallest and largest) keep their nearest rounding
(:func:`._rounding.range_ends`), so the backends recompute the same scales and store exactly the learned
integers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from resnet8ptq.algorithms.base import Algorithm, Context

if TYPE_CHECKING:
    import onnx

    from resnet8ptq.spec import QuantSpec


@dataclass
class AdaRoundParameters:
    """``iterations``: Adam steps per layer; ``batch_size``: calibration images per step."""

    iterations: int = 1000
    batch_size: int = 32

    def __post_init__(self) -> None:
        if self.iterations < 1 or self.batch_size < 1:
            raise ValueError(
                "algo.adaround_iterations and algo.adaround_batch_size: expected positive numbers."
            )


class AdaRound(Algorithm):
    """``adaround``: the weight-rounding stage, after equalization and before bias correction."""

    NAME = "adaround"
    STAGE = 20
    Parameters = AdaRoundParameters

    def apply(self, model: onnx.ModelProto, context: Context) -> dict[str, str]:
        settings: AdaRoundParameters = self.parameters
        flipped = adaround(
            model, context.images, context.spec, settings.iterations, settings.batch_size, context.seed
        )
        return {"adaround_flipped": f"{np.mean(list(flipped.values())):.4f}"}


def adaround(
    model: onnx.ModelProto, images: np.ndarray, spec: QuantSpec, iterations: int, batch: int, seed: int
) -> dict[str, float]:
    """Round every conv/gemm weight adaptively, in place; returns per layer the fraction of elements
    rounded differently from round-to-nearest."""
    import torch

    from resnet8ptq.algorithms._graph import layer_inputs, set_initializer
    from resnet8ptq.layers import weight_widths
    from resnet8ptq.weight_grid import channel_axis, quantized_weights, weight_grid

    torch.manual_seed(seed)
    weights = quantized_weights(model)
    widths = weight_widths(model, spec)
    nodes = [node for node, _ in weights.values()]
    inputs = layer_inputs(model, nodes, images)
    inits = {init.name: init for init in model.graph.initializer}
    flipped = {}
    for node in nodes:
        weight = weights[node.input[1]][1]
        grid = weight_grid(weight, channel_axis(node), spec, widths[node.input[1]])
        integers = _fit(node, weight, grid, inputs[node.input[0]], iterations, batch)
        flipped[node.name] = float(np.mean(integers != grid.quantize(weight)))
        set_initializer(inits[node.input[1]], grid.dequantize(integers))
    return flipped


def _fit(node, weight, grid, x: np.ndarray, iterations: int, batch: int) -> np.ndarray:
    """The learned integers of one layer's weight."""
    import onnx
    import torch
    import torch.nn.functional as F

    from resnet8ptq.algorithms._rounding import REGULARIZATION, SoftRounding, regularization

    rounding = SoftRounding(weight, grid)
    w = torch.from_numpy(weight)
    data = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    if node.op_type == "Conv":
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        top, left, bottom, right = attributes.get("pads", [0, 0, 0, 0])
        stride, dilation = attributes.get("strides", [1, 1]), attributes.get("dilations", [1, 1])
        groups = attributes.get("group", 1)  # a depthwise convolution: one group per channel

        def layer(inputs: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
            padded = F.pad(inputs, (left, right, top, bottom))
            return F.conv2d(padded, kernel, stride=stride, dilation=dilation, groups=groups)
    else:
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)

        def layer(inputs: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
            return inputs.reshape(len(inputs), -1) @ (kernel.T if trans_b else kernel)

    optimizer = torch.optim.Adam(rounding.parameters(), lr=1e-2)
    for step in range(iterations):
        sample = data[torch.randint(len(data), (batch,))]
        with torch.no_grad():
            target = layer(sample, w)
        loss = F.mse_loss(layer(sample, rounding()), target)
        beta = regularization(step, iterations)
        if beta is not None:
            loss = loss + REGULARIZATION * rounding.regularizer(beta)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return rounding.integers()
