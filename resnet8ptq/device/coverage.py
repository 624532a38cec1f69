"""What the device computes, checked on the FP32 model before any quantization: a network with an operator
the integer device has no integer form of (a ``Rescaling`` layer's Mul, a Squeeze left dynamic, a MatMul
ORT did not fuse into a Gemm) is refused naming each such node, instead of after its quantization and
evaluation, when a toolchain's reader meets it. The readers (``backends/<name>/integer.py``) stay the
authority on a quantized model; this is the same coverage seen from the canonical ONNX model all toolchains
start from."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from resnet8ptq.errors import Unsupported

if TYPE_CHECKING:
    from resnet8ptq.device.config import Crossbar

LAYERS = {"Conv", "Gemm", "Add", "AveragePool", "GlobalAveragePool", "MaxPool"}
"""The FP32 operators the integer device computes as layers (conv, dense, add, pools; a global average pool
is Keras' GlobalAveragePooling2D, which tf2onnx writes as GlobalAveragePool)."""
CARRIED = {"Relu", "Clip", "Reshape", "Flatten", "Transpose", "Softmax"}
"""Operators read as part of a layer (a ReLU or ReLU6 clamp), carrying no arithmetic, or after the logits."""


def uncovered(onnx_path: Path) -> list[str]:
    """The nodes of the FP32 ONNX model at ``onnx_path`` the device does not compute, as ``op (name)``: any
    operator outside :data:`LAYERS` and :data:`CARRIED`, a Clip not from 0, an AveragePool over less than
    its whole input."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.shape_inference.infer_shapes(onnx.load(onnx_path, load_external_data=False)).graph
    constants = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    shapes = {
        info.name: [d.dim_value if d.HasField("dim_value") else None for d in info.type.tensor_type.shape.dim]
        for info in [*graph.input, *graph.value_info]
    }
    found = []
    for node in graph.node:
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type not in LAYERS | CARRIED:
            found.append(f"{node.op_type} ({node.name or node.output[0]})")
        elif node.op_type == "Clip" and float(constants.get([*node.input, ""][1], 1.0)) != 0.0:
            found.append(f"Clip not from 0 ({node.name or node.output[0]})")
        elif node.op_type == "AveragePool" and not whole_input(attributes, shapes.get(node.input[0], [])):
            window = "x".join(map(str, attributes.get("kernel_shape", [])))
            found.append(f"AveragePool {window}, not over its whole input ({node.name or node.output[0]})")
    return found


def whole_input(attributes: dict, shape: list[int | None]) -> bool:
    """Whether an AveragePool averages each channel's whole (N, C, H, W) input, unpadded: the one pool the
    device's average computes (a global average, as Keras' AveragePooling2D over the last feature map)."""
    spatial, padding = shape[2:], attributes.get("auto_pad", b"NOTSET")
    unpadded = not any(attributes.get("pads", [])) and padding in (b"NOTSET", "NOTSET")
    whole = bool(spatial) and None not in spatial and list(attributes.get("kernel_shape", [])) == spatial
    return whole and unpadded


def grouped_convolutions(onnx_path: Path) -> list[str]:
    """The grouped (depthwise) convolutions of the FP32 ONNX model at ``onnx_path``, as ``Conv (name)``."""
    import onnx

    graph = onnx.load(onnx_path, load_external_data=False).graph
    return [
        f"Conv ({node.name or node.output[0]})"
        for node in graph.node
        if node.op_type == "Conv" and any(a.name == "group" and a.i > 1 for a in node.attribute)
    ]


def check_learnable_layers(onnx_path: Path, model: str) -> None:
    """Refuse, before any work, device-aware learning (``algo.device_aware``) of a network with grouped
    convolutions: it models ungrouped conv and dense layers on the crossbar only."""
    grouped = grouped_convolutions(onnx_path)
    if grouped:
        shown = ", ".join(grouped[:4]) + (f" and {len(grouped) - 4} more" if len(grouped) > 4 else "")
        raise Unsupported(
            f"algo.device_aware=true cannot learn {model} against the crossbar: it has grouped (depthwise) "
            f"convolutions, {shown}; the learning models ungrouped conv and dense layers only. Set "
            "algo.device_aware=false (the device still runs them)."
        )


def check_coverage(onnx_path: Path, kind: str, model: str) -> None:
    """Refuse, before any work, a network the ``kind`` device (``integer``, ``cim``) cannot compute."""
    found = uncovered(onnx_path)
    if found:
        shown = ", ".join(found[:8]) + (f" and {len(found) - 8} more" if len(found) > 8 else "")
        raise Unsupported(
            f"device={kind} cannot run {model}: {shown}. The integer device computes Conv (grouped too), "
            "Gemm, Add, AveragePool over a whole input, GlobalAveragePool and MaxPool, with ReLU or ReLU6 "
            "after a layer; fold other arithmetic into the model's layers (e.g. a Rescaling into the data), "
            "or set device=none."
        )


def check_learnable(crossbar: Crossbar) -> None:
    """Fail unless device-aware learning (:mod:`resnet8ptq.algorithms._crossbar`) models ``crossbar``'s
    partial sums: ADCs of a set width, whole inputs (``dac_bits`` 8, ``dac_range`` full), one cell per
    weight."""
    problems = []
    if crossbar.adc_bits is None:
        problems.append("device.adc_bits=null (an ideal ADC: no ADC step to learn)")
    if crossbar.dac_bits < 8 or crossbar.dac_range != "full":
        problems.append(
            f"device.dac_bits={crossbar.dac_bits} device.dac_range={crossbar.dac_range} (bit-serial or "
            "clipped inputs; the learning applies whole 8-bit inputs: dac_bits=8, dac_range=full)"
        )
    if crossbar.cells_per_weight != 1:
        problems.append(
            f"device.cells_per_weight={crossbar.cells_per_weight} (weights sliced over cells; the learning "
            "holds a weight in one cell)"
        )
    if problems:
        raise ValueError("algo.device_aware=true cannot learn against " + "; ".join(problems) + ".")
