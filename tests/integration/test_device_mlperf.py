"""The integer device on networks it was not built on (issue 73, item 5): MLPerf Tiny's own int8 models of
visual wake words (MobileNetV1 0.25: 13 depthwise convolutions), keyword spotting (DS-CNN: 4 depthwise) and
anomaly detection (a chain of 10 fully-connected layers on a 640-value vector), read from their .tflite files
and run by the integer executor, give every layer's int8 output of LiteRT's reference kernels
(``BUILTIN_REF``) to the bit, the logits included (the host's softmax is not the device's). On a crossbar
(issue 74) with an exact ADC they give the integer device's logits, their depthwise layers on arrays or on the
digital unit, and are counted and costed.

The inputs are generated (uniform int8, seeded): these models' data sets are not on these machines, and
bit-exactness is a property of the arithmetic, not of the data; shared/models/mlperf_tiny/ holds the files.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter

from resnet8ptq.backends.tflite.integer import integer_model
from resnet8ptq.device.actions import device_actions, utilisation
from resnet8ptq.device.cim import CrossbarArithmetic
from resnet8ptq.device.config import DEPTHWISE, DeviceConfig
from resnet8ptq.device.executor import execute
from resnet8ptq.device.graph import IntegerModel
from tests.integration.litert_reference import reference_layers

MODELS = {
    "vww": ("visual_wake_words/vww_96_int8.tflite", {"DEPTHWISE_CONV_2D": 13}),
    "kws": ("keyword_spotting/kws_ref_model.tflite", {"DEPTHWISE_CONV_2D": 4}),
    "ad": ("anomaly_detection/ad01_int8.tflite", {"FULLY_CONNECTED": 10}),
}
"""Each model's file under models/mlperf_tiny/ and the layers of the kind ResNet8 lacks that it must hold."""
INPUTS = 200


@pytest.mark.parametrize("name", list(MODELS))
def test_the_integer_device_is_litert_reference_kernels(name: str, assets_dir: Path) -> None:
    file, kinds = MODELS[name]
    path = assets_dir / "models" / "mlperf_tiny" / file
    assert path.is_file(), f"{path} is missing: shared/models/mlperf_tiny/ holds MLPerf Tiny's models"
    integer = integer_model(path)
    depthwise = sum(conv.depthwise for conv in integer.convs)
    dense = sum(conv.dense for conv in integer.convs)
    assert {"DEPTHWISE_CONV_2D": depthwise, "FULLY_CONNECTED": dense}.items() >= kinds.items()

    assert_bit_exact(path, integer)


@pytest.mark.parametrize("name", list(MODELS))
def test_mlperfs_models_run_on_crossbars_with_either_depthwise_mapping(name: str, assets_dir: Path) -> None:
    """On 128-row arrays of 4-bit cells (two per weight) with an exact ADC, each model's logits (8 inputs) are
    the integer device's, its depthwise layers on crossbars (block-diagonal) or on the digital unit; both
    mappings are counted and costed (5-bit ADCs), and on crossbars the depthwise kernels take more arrays and
    leave more of their cells unused."""
    path = assets_dir / "models" / "mlperf_tiny" / MODELS[name][0]
    integer = integer_model(path)
    inputs = generated_inputs(path, 8)
    chip = {"rows": 128, "adc_bits": 5, "bits_per_cell": 4, "cells_per_weight": 2}
    expected, _ = execute(integer, inputs)
    chips = {}
    for mapping in DEPTHWISE:
        device = DeviceConfig(kind="cim", **chip, depthwise=mapping)
        exact = dataclasses.replace(device.crossbar(), adc_bits=None)
        logits, _ = execute(integer, inputs, CrossbarArithmetic(exact))
        assert np.array_equal(logits, expected), (
            f"{name}, depthwise={mapping}: logits differ from the integer device"
        )
        counted = device_actions(integer, device, inputs[:1], inputs)
        grouped = [layer for layer in counted if layer.groups > 1]
        assert {layer.mapping for layer in grouped} <= {mapping}
        chips[mapping] = counted
    arrays = {mapping: sum(layer.arrays for layer in counted) for mapping, counted in chips.items()}
    if any(conv.groups > 1 for conv in integer.convs):
        assert arrays["crossbar"] > arrays["digital"]
        assert utilisation(chips["crossbar"]) < utilisation(chips["digital"])
    else:
        assert arrays["crossbar"] == arrays["digital"]
    components = pytest.importorskip(
        "resnet8ptq.components.costs", reason="hwcomponents needs Python >= 3.12"
    )
    from resnet8ptq.components.config import ComponentsConfig

    for mapping, counted in chips.items():
        device = DeviceConfig(kind="cim", **chip, depthwise=mapping)
        cost = components.chip_cost(counted, device, ComponentsConfig())
        assert cost.total_energy > 0 and cost.total_area > 0
        assert (cost.energy["mac"] > 0) == (mapping == "digital" and name != "ad")


def generated_inputs(path: Path, count: int) -> np.ndarray:
    """``count`` seeded uniform int8 inputs of the int8 .tflite at ``path``, as real values the executor
    quantizes back to exactly those integers (x / scale is within 2 ulps of one)."""
    detail = Interpreter(model_path=str(path)).get_input_details()[0]
    scale, zero_point = detail["quantization"]
    assert detail["dtype"] == np.int8
    rng = np.random.default_rng(73)
    inputs = rng.integers(-128, 128, size=(count, *detail["shape"][1:]), dtype=np.int8)
    return (inputs.astype(np.float32) - np.float32(zero_point)) * np.float32(scale)


def assert_bit_exact(path: Path, integer: IntegerModel) -> None:
    """Every layer's output of ``integer`` (read from the int8 .tflite at ``path``) on :data:`INPUTS`
    generated int8 inputs equals LiteRT's reference kernels'."""
    real = generated_inputs(path, INPUTS)
    _, trace = execute(integer, real, batch_size=INPUTS, trace_images=INPUTS)
    layers = [integer.input, *(layer.output for layer in integer.layers)]
    reference = reference_layers(path, real, layers)
    differing = {}
    for tensor in layers:
        ours = trace.outputs[tensor].numpy().reshape(reference[tensor].shape)
        if not np.array_equal(ours, reference[tensor]):
            differing[tensor] = int((ours != reference[tensor]).sum())
    assert not differing, f"{path.name}: outputs differing from LiteRT's reference kernels: {differing}"
    assert len(np.unique(reference[integer.output])) > 1, "constant logits: nothing was compared"


def test_relu6_max_pooling_and_depthwise_from_tflites_converter(tmp_path: Path) -> None:
    """A seeded Keras network converted to int8 by TFLite's converter (keras_int8_child.py): a conv with
    ReLU6, a 3x3 stride-2 max pool with SAME padding (one padded row and column, after), a depthwise conv with
    ReLU6, then the layers ResNet8 has; bit for bit as LiteRT's reference kernels. (The converter calibrates
    a ReLU6 output to at most 6, so its clamp is the type's top here; tests/unit/test_device.py checks a
    ReLU6 clamp below it.)"""
    path = tmp_path / "network.tflite"
    child = Path(__file__).with_name("keras_int8_child.py")
    done = subprocess.run(
        [sys.executable, str(child), str(path)], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    integer = integer_model(path)
    kinds = [type(layer).__name__ for layer in integer.layers]
    assert kinds == ["Conv", "MaxPool", "Conv", "Conv", "AveragePool", "Conv"]
    pool = integer.layers[1]
    assert pool.padding == (0, 1, 0, 1) and pool.kernel == (3, 3) and pool.stride == (2, 2)
    assert integer.layers[2].depthwise
    assert_bit_exact(path, integer)
