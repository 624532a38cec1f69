"""Empirical bias correction of the weight-quantization error (Nagel et al., arXiv:1906.04721, section 4.2).

Quantizing a layer's weights W to W_q shifts the mean of its outputs by E[(W_q - W) x]. For each conv/gemm
layer this shift is measured on the calibration sample (x: the layer's inputs in the FP32 model, with the
layer's own padding, so borders count exactly) and subtracted from the layer's bias. W_q is the grid the
backends will put the weights on (:mod:`resnet8ptq.weight_grid`): the weights themselves are unchanged, so the
backends quantize them to exactly that grid and the corrected bias cancels the mean shift they cause.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from resnet8ptq.algorithms.base import Algorithm, Context

if TYPE_CHECKING:
    import onnx

    from resnet8ptq.spec import QuantSpec


class BiasCorrection(Algorithm):
    """``bias_correction``: last, so that it corrects the error of the final weights."""

    NAME = "bias_correction"
    STAGE = 30

    def apply(self, model: onnx.ModelProto, context: Context) -> dict[str, str]:
        return {"bias_correction_layers": str(len(correct_biases(model, context.images, context.spec)))}


def correct_biases(model: onnx.ModelProto, images: np.ndarray, spec: QuantSpec) -> dict[str, float]:
    """Correct every conv/gemm bias in place; returns each layer's largest correction relative to its
    bias range (how much it moved)."""
    from onnx import numpy_helper

    from resnet8ptq.algorithms._graph import set_initializer
    from resnet8ptq.layers import weight_widths
    from resnet8ptq.weight_grid import channel_axis, quantized_weights, weight_grid

    weights = quantized_weights(model)
    widths = weight_widths(model, spec)
    layers = [node for node, _ in weights.values() if len(node.input) > 2 and node.input[2]]
    means = _input_window_means(model, layers, images)
    inits = {init.name: init for init in model.graph.initializer}
    moved = {}
    for node in layers:
        weight = weights[node.input[1]][1]
        grid = weight_grid(weight, channel_axis(node), spec, widths[node.input[1]])
        error = grid.fake_quantize(weight) - weight
        if node.op_type == "Conv":  # E[conv(x, dW)] = sum over (c, kh, kw) of dW * mean of x's window
            shift = np.einsum("ochw,chw->o", error.astype(np.float64), means[node.name])
        else:  # Gemm/MatMul: E[x dW]
            trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
            shift = means[node.name] @ (error.T if trans_b else error).astype(np.float64)
        bias = numpy_helper.to_array(inits[node.input[2]]).astype(np.float64)
        set_initializer(inits[node.input[2]], bias - shift)
        moved[node.name] = float(np.abs(shift).max() / max(np.ptp(bias), 1e-12))
    return moved


def _input_window_means(
    model: onnx.ModelProto, layers: list[onnx.NodeProto], images: np.ndarray
) -> dict[str, np.ndarray]:
    """For each conv, the mean over images and output positions of each input value its kernel sees,
    (C, KH, KW); for each gemm, the mean input vector. Inputs from the FP32 model on ``images``."""

    def window_sums(node: onnx.NodeProto, x: np.ndarray) -> np.ndarray:
        return _conv_window_sums(node, x) if node.op_type == "Conv" else x.reshape(len(x), -1).sum(axis=0)

    from resnet8ptq.algorithms._graph import layer_inputs

    sums = layer_inputs(model, layers, images, window_sums)
    return {name: total / len(images) for name, total in sums.items()}


def _conv_window_sums(node: onnx.NodeProto, x: np.ndarray) -> np.ndarray:
    """Sum over the batch of the per-position means of each kernel tap's input window: (C, KH, KW)."""
    import onnx

    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    if attributes.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET") or any(
        d != 1 for d in attributes.get("dilations", [1, 1])
    ):
        raise ValueError(f"{node.name}: bias correction handles explicit pads and dilation 1 only.")
    kh, kw = attributes["kernel_shape"]
    stride_h, stride_w = attributes.get("strides", [1, 1])
    top, left, bottom, right = attributes.get("pads", [0, 0, 0, 0])
    padded = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    out_h = (padded.shape[2] - kh) // stride_h + 1
    out_w = (padded.shape[3] - kw) // stride_w + 1
    sums = np.empty((x.shape[1], kh, kw))
    for i in range(kh):
        for j in range(kw):
            window = padded[
                :,
                :,
                i : i + stride_h * (out_h - 1) + 1 : stride_h,
                j : j + stride_w * (out_w - 1) + 1 : stride_w,
            ]
            sums[:, i, j] = window.mean(axis=(2, 3)).sum(axis=0)
    return sums
