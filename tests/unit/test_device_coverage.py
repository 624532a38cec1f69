"""What the device computes, read from the FP32 model before any work: every operator it has no integer form
of is named (a grouped convolution is covered, on the crossbar too); device-aware learning refuses a grouped
convolution."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from resnet8ptq.device.coverage import check_coverage, check_learnable_layers, uncovered
from resnet8ptq.errors import Unsupported


def network(path: Path, first: str = "Relu", clip_low: float = 0.0, pool: str = "GlobalAveragePool") -> Path:
    """input -> ``first`` (Relu, Mul by a constant, or Clip from ``clip_low`` to 6) -> depthwise Conv -> Relu
    -> ``pool`` (GlobalAveragePool, AveragePool of 8x8 or of 2x2) -> Flatten -> Gemm."""
    rng = np.random.default_rng(0)
    nodes = {
        "Relu": helper.make_node("Relu", ["input"], ["a"], name="first"),
        "Mul": helper.make_node("Mul", ["input", "scale"], ["a"], name="rescale"),
        "Clip": helper.make_node("Clip", ["input", "low", "six"], ["a"], name="clip"),
    }
    pools = {
        "GlobalAveragePool": helper.make_node("GlobalAveragePool", ["c"], ["d"], name="gap"),
        "AveragePool8": helper.make_node("AveragePool", ["c"], ["d"], name="pool", kernel_shape=[8, 8]),
        "AveragePool2": helper.make_node("AveragePool", ["c"], ["d"], name="pool", kernel_shape=[2, 2]),
    }
    graph = helper.make_graph(
        [
            nodes[first],
            helper.make_node("Conv", ["a", "w"], ["b"], name="dw", group=4, pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["b"], ["c"]),
            pools[pool],
            helper.make_node("Flatten", ["d"], ["e"]),
            helper.make_node("Gemm", ["e", "fc", "bias"], ["output"], transB=1),
        ],
        "g",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 4, 8, 8])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 3])],
        [
            numpy_helper.from_array(np.float32(1 / 255), "scale"),
            numpy_helper.from_array(np.float32(clip_low), "low"),
            numpy_helper.from_array(np.float32(6), "six"),
            numpy_helper.from_array(rng.random((4, 1, 3, 3), dtype=np.float32), "w"),
            numpy_helper.from_array(rng.random((3, 4), dtype=np.float32), "fc"),
            numpy_helper.from_array(np.zeros(3, np.float32), "bias"),
        ],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_every_uncovered_operator_is_named(tmp_path: Path) -> None:
    assert uncovered(network(tmp_path / "a.onnx")) == []  # a global average pool: covered
    assert uncovered(network(tmp_path / "b.onnx", "Mul")) == ["Mul (rescale)"]
    assert uncovered(network(tmp_path / "c.onnx", "Clip")) == []  # ReLU6: covered
    assert uncovered(network(tmp_path / "d.onnx", "Clip", -1.0)) == ["Clip not from 0 (clip)"]


def test_an_average_pool_is_covered_over_its_whole_input_only(tmp_path: Path) -> None:
    assert uncovered(network(tmp_path / "a.onnx", pool="AveragePool8")) == []
    assert uncovered(network(tmp_path / "b.onnx", pool="AveragePool2")) == [
        "AveragePool 2x2, not over its whole input (pool)"
    ]


def test_a_network_with_an_uncovered_operator_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(Unsupported, match=r"device=integer cannot run model=x: Mul \(rescale\)\. The"):
        check_coverage(network(tmp_path / "b.onnx", "Mul"), "integer", "model=x")


def test_device_aware_learning_refuses_a_grouped_convolution_before_any_work(tmp_path: Path) -> None:
    check_coverage(network(tmp_path / "a.onnx"), "cim", "model=x")  # the crossbar maps it
    with pytest.raises(Unsupported, match=r"algo.device_aware=true cannot learn model=x .* Conv \(dw\); .*"):
        check_learnable_layers(network(tmp_path / "a.onnx"), "model=x")
