"""A PyTorch PT2E program (the saved ``.pt2``) as the device's integer description.

The program's graph holds ``quantized_decomposed`` quantize/dequantize ops around aten conv2d, linear, add,
relu, avg_pool2d, mean (a global average pool), pad and reshape. A quantize op defines a quantized tensor (its
scale, zero point and the integer range it clamps to, which is narrower than int8 for low-bit activations); a
dequantize op on a stored constant is a weight (per channel or per tensor). Two PT2E patterns need care: an
asymmetric zero pad in front of a strided conv (requantized with the same parameters, so it is the conv's
padding), and X86InductorQuantizer's fused conv + add + ReLU, whose conv output is never quantized on its own
(lowered as a conv with a residual input). Floating-point biases are rounded to int32 at x_scale · w_scale.
The lowering is shared with ONNX Runtime's models (:mod:`resnet8ptq.device.qdq`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import fx

from resnet8ptq.backends.torch.program import _stored_tensor, qdq_op
from resnet8ptq.device.graph import IntegerModel, Quant
from resnet8ptq.device.qdq import QdqLayer, is_layout_reshape, lower

AFTER_LOGITS = {"softmax"}
LAYER_TARGETS = {"conv2d", "linear", "add", "avg_pool2d", "mean", "max_pool2d"}
CLAMPS = ("hardtanh", "clamp")
"""A ReLU6 as the program holds it (onnx2torch turns ONNX's Clip into ``clamp``)."""
NO_ARITHMETIC = {
    "pad",
    "relu",
    *CLAMPS,
    "permute",
    "reshape",
    "view",
    "flatten",
    "contiguous",
    "clone",
    "dropout",
}
"""Ops read as part of a layer or carrying no arithmetic; any other op of the program is refused by name."""


def _target(node: fx.Node) -> str:
    return getattr(node.target, "__name__", str(node.target)).split(".")[0]


def integer_model(path: Path) -> IntegerModel:
    """The integer description of the PT2E program saved at ``path``."""
    import torchao.quantization.pt2e  # noqa: F401 (registers the quantized_decomposed ops for loading)

    program = torch.export.load(str(path))
    quants: dict[str, Quant] = {}
    dequantized: dict[str, str] = {}  # dequantize node -> the quantized tensor (quantize node) it reads
    weights: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}  # dequantize node -> w, scales, zps
    padded: dict[str, tuple[str, list[int]]] = {}  # pad node -> (quantized input, [left, right, top, bottom])
    alias: dict[str, str] = {}  # quantized tensor -> the quantized tensor holding the same integers
    pads_of: dict[str, list[int]] = {}  # a padded tensor's quantize node -> [left, right, top, bottom]
    pool_windows: dict[str, int] = {}
    convs: dict[str, QdqLayer] = {}  # conv/linear node -> its layer (output known once quantized or added)
    layers: list[QdqLayer] = []
    clamps: dict[str, float] = {}  # layer node -> its ReLU6's upper bound
    input_name = ""

    def value(arg: object) -> np.ndarray:
        if isinstance(arg, fx.Node):
            return _stored_tensor(program, arg).detach().numpy()
        return np.asarray(arg)

    def quantized(node: fx.Node) -> str:
        """The quantized tensor a float input of a layer dequantizes."""
        if node.name not in dequantized:
            raise ValueError(f"{node.name} ({_target(node)}) is not a dequantized tensor.")
        name = dequantized[node.name]
        return alias.get(name, name)

    def output_of(node: fx.Node) -> tuple[str, bool, fx.Node]:
        """Follow a layer's float output through a ReLU (or a ReLU6: ``hardtanh``/``clamp`` from 0, its upper
        bound kept in ``clamps``) to its quantize op: (its name, relu, last node)."""
        users = list(node.users)
        relu = len(users) == 1 and _target(users[0]) in ("relu", *CLAMPS)
        if relu and _target(users[0]) in CLAMPS:
            low, high = [*users[0].args[1:3], None, None][:2]
            if low not in (0, 0.0) or high is None:
                raise ValueError(
                    f"{users[0].name}: a clamp to ({low}, {high}) is not covered (ReLU6: from 0)."
                )
            clamps[node.name] = float(high)
        last = users[0] if relu else node
        (quantize,) = [user for user in last.users if qdq_op(user) == "quantize_per_tensor"] or [None]
        return (quantize.name if quantize is not None else ""), relu, last

    for node in program.graph.nodes:
        op, target = qdq_op(node), _target(node) if node.op == "call_function" else ""
        if op == "quantize_per_tensor":
            source, scale, zero_point, qmin, qmax = node.args[:5]
            quants[node.name] = Quant(float(np.float32(scale)), int(zero_point), int(qmin), int(qmax))
            if source.name in padded:  # the pad's output requantized with its input's parameters
                alias[node.name], pads_of[node.name] = padded[source.name]
            elif _target(source) in ("reshape", "view", "flatten") and source.args[0].name in dequantized:
                alias[node.name] = quantized(source.args[0])
            elif _target(source) == "permute" and source.args[0].op == "placeholder":
                input_name = node.name
            elif _target(source) in ("reshape", "view") and source.args[0].op == "placeholder":
                shapes = (tuple(source.args[0].meta["val"].shape), tuple(source.meta["val"].shape))
                if not is_layout_reshape(*shapes):
                    raise ValueError(f"{source.name}: a reshape of the model input is not covered.")
                input_name = node.name
            elif source.op == "placeholder" and source.name in program.graph_signature.user_inputs:
                input_name = node.name  # a model whose input needs no layout change (vectors)
        elif op and op.startswith("dequantize"):
            source = node.args[0]
            if source.op == "placeholder":
                scale, zero_point = value(node.args[1]), value(node.args[2])
                weights[node.name] = (value(source), np.atleast_1d(scale), np.atleast_1d(zero_point))
            else:
                dequantized[node.name] = source.name
        elif target == "pad":
            pads = list(node.args[1])
            if len(node.args) > 3 and node.args[3] not in (0, 0.0, None):
                raise ValueError(
                    f"{node.name}: padding with {node.args[3]} is not covered (zero padding only)."
                )
            padded[node.name] = (quantized(node.args[0]), pads)
        elif target in ("conv2d", "linear"):
            source = node.args[0]
            left, right, top, bottom = pads_of.get(dequantized.get(source.name, ""), [0, 0, 0, 0])
            padding = (top, bottom, left, right)
            weight, w_scale, w_zp = weights[node.args[1].name]
            bias = value(node.args[2]) if len(node.args) > 2 and node.args[2] is not None else None
            layer = QdqLayer(
                "conv" if target == "conv2d" else "dense",
                node.name,
                [quantized(source)],
                "",
                weight=weight if target == "conv2d" else weight[:, :, None, None],
                weight_scale=w_scale,
                weight_zero_point=w_zp,
                bias=bias,
                bias_is_float=bias is not None,
            )
            if target == "conv2d":
                args = list(node.args) + [None] * 7
                stride, conv_padding, dilation, groups = (
                    args[3] or [1, 1],
                    args[4] or [0, 0],
                    args[5],
                    args[6],
                )
                if dilation not in (None, [1, 1]):
                    raise ValueError(f"{node.name}: dilated convolutions are not covered.")
                layer.groups = groups or 1
                ph, pw = conv_padding
                layer.stride = tuple(stride)
                layer.padding = tuple(p + q for p, q in zip(padding, (ph, ph, pw, pw), strict=True))
            name, relu, _ = output_of(node)
            layer.output, layer.relu, layer.relu_max = name, relu, clamps.get(node.name)
            convs[node.name] = layer
            layers.append(layer)
        elif target == "add":
            a, b = node.args[:2]
            fused = [arg for arg in (a, b) if arg.name in convs and not convs[arg.name].output]
            name, relu, _ = output_of(node)
            if fused:  # X86InductorQuantizer's conv + add (+ ReLU): the conv's output is not quantized
                (conv,) = fused
                other = b if conv is a else a
                layer = convs[conv.name]
                layer.residual, layer.output, layer.relu = quantized(other), name, relu
                layer.relu_max = clamps.get(node.name)
            else:
                layer = QdqLayer("add", node.name, [quantized(a), quantized(b)], name, relu=relu)
                layer.relu_max = clamps.get(node.name)
                layers.append(layer)
        elif target in ("avg_pool2d", "mean"):
            window = pool_window(node)
            name, relu, _ = output_of(node)
            layer = QdqLayer("average_pool", node.name, [quantized(node.args[0])], name, relu=relu)
            layer.relu_max = clamps.get(node.name)
            layers.append(layer)
            pool_windows[layer.name] = window
        elif target == "max_pool2d":
            args = list(node.args) + [None] * 6
            kernel = tuple(args[1])
            stride, pool_padding, dilation, ceil_mode = (
                tuple(args[2] or kernel),
                args[3] or [0, 0],
                args[4],
                args[5],
            )
            if dilation not in (None, 1, [1, 1]) or ceil_mode:
                raise ValueError(f"{node.name}: max_pool2d with dilation or ceil_mode is not covered.")
            ph, pw = pool_padding
            name, relu, _ = output_of(node)
            layer = QdqLayer("max_pool", node.name, [quantized(node.args[0])], name, relu=relu)
            layer.relu_max = clamps.get(node.name)
            layer.kernel, layer.stride, layer.padding = kernel, stride, (ph, ph, pw, pw)
            layers.append(layer)
        elif target in AFTER_LOGITS:
            break
        elif node.op == "call_function" and not op and target not in NO_ARITHMETIC | LAYER_TARGETS:
            raise ValueError(
                f"{Path(path).name}: op {target} ({node.name}) is not covered by the integer executor."
            )
    if not input_name:
        raise ValueError(f"{Path(path).name}: no quantized model input found.")
    if layers and not layers[-1].output:  # the logits left in float (no quantize before the softmax)
        layers[-1].output = layers[-1].name
    missing = [layer.name for layer in layers if not layer.output]
    if missing:
        raise ValueError(f"{Path(path).name}: layers {missing} have no quantized output.")
    notes = [
        "PyTorch's program computes each layer in float (biases in float) and quantizes rounding half to "
        "even; the integer form rounds biases to int32, accumulates exactly and requantizes in fixed point."
    ]
    return lower("torch-pt2e", layers, quants, input_name, pool_windows, notes)


def pool_window(node: fx.Node) -> int:
    """The positions an average pool sums: an ``avg_pool2d``'s kernel, or for a ``mean`` (onnx2torch's
    GlobalAveragePool) its input's H x W, the only mean covered."""
    if _target(node) == "avg_pool2d":
        return int(np.prod(node.args[1]))
    shape = tuple(node.args[0].meta["val"].shape)
    axes = {axis % len(shape) for axis in node.args[1]} if len(node.args) > 1 else set()
    if len(shape) != 4 or axes != {2, 3}:
        raise ValueError(f"{node.name}: a mean over dims {node.args[1:2]} of {shape}: H and W only.")
    return shape[2] * shape[3]
