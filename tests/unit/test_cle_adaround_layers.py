"""CLE and AdaRound on the layers MLPerf Tiny's other networks have: depthwise convolutions (KWS's DS-CNN,
VWW's MobileNet) and dense chains (the anomaly-detection autoencoder), on small seeded ONNX graphs run in
ONNX Runtime (AdaRound once failed on a depthwise layer: its reconstruction ignored the groups)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from resnet8ptq.algorithms.adaround import adaround
from resnet8ptq.algorithms.cle import equalizable_pairs, equalize
from resnet8ptq.calibration import CalibConfig
from resnet8ptq.dtype import DtypeConfig
from resnet8ptq.spec import QuantSpec
from resnet8ptq.weight_grid import channel_axis, quantized_weights, weight_grid


def graph(
    layers: list[tuple[str, np.ndarray, dict]], activation: str, input_shape: list[int]
) -> onnx.ModelProto:
    """A chain of ``(op, weight, attributes)`` layers (Conv or Gemm, each with a bias), ``activation``
    (Relu, or Clip 0-6) between them; seeded weights whose channel ranges differ widely."""
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i, (op, weight, attributes) in enumerate(layers):
        outputs = weight.shape[1] if op == "Gemm" and not attributes.get("transB") else weight.shape[0]
        inits += [
            numpy_helper.from_array(weight.astype(np.float32), f"w{i}"),
            numpy_helper.from_array(rng.normal(0, 0.1, outputs).astype(np.float32), f"b{i}"),
        ]
        nodes.append(helper.make_node(op, [x, f"w{i}", f"b{i}"], [f"y{i}"], name=f"layer{i}", **attributes))
        x = f"y{i}"
        if i < len(layers) - 1:
            if activation == "Relu":
                nodes.append(helper.make_node("Relu", [x], [f"r{i}"], name=f"relu{i}"))
            else:
                inits += [numpy_helper.from_array(np.float32(v), f"c{i}_{v}") for v in (0, 6)]
                nodes.append(helper.make_node("Clip", [x, f"c{i}_0", f"c{i}_6"], [f"r{i}"], name=f"relu6{i}"))
            x = f"r{i}"
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", *input_shape[1:]])]
    outputs = [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)]
    chain = helper.make_graph(nodes, "chain", inputs, outputs, inits)
    return helper.make_model(chain, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def spread(shape: tuple[int, ...], axis: int, seed: int) -> np.ndarray:
    """Seeded weights whose channels along ``axis`` span ranges 100x apart."""
    weight = np.random.default_rng(seed).normal(size=shape)
    factor = np.geomspace(0.05, 5.0, shape[axis]).reshape([-1 if a == axis else 1 for a in range(len(shape))])
    return weight * factor


def run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


DEPTHWISE_SEPARABLE = [  # conv -> depthwise -> pointwise, as a DS-CNN block
    ("Conv", spread((8, 3, 3, 3), 0, 1), {"pads": [1, 1, 1, 1]}),
    ("Conv", spread((8, 1, 3, 3), 0, 2), {"group": 8, "pads": [1, 1, 1, 1]}),
    ("Conv", spread((6, 8, 1, 1), 1, 3), {}),
]
DENSE_CHAIN = [  # an autoencoder's Gemms, both weight layouts
    ("Gemm", spread((16, 12), 1, 4), {}),
    ("Gemm", spread((10, 12), 1, 5), {"transB": 1}),
    ("Gemm", spread((10, 16), 0, 6), {}),
]


@pytest.mark.parametrize(
    ("layers", "shape"), [(DEPTHWISE_SEPARABLE, [4, 3, 6, 6]), (DENSE_CHAIN, [4, 16])], ids=["dw", "dense"]
)
def test_cle_equalizes_depthwise_and_dense_pairs_keeping_the_function(layers: list, shape: list) -> None:
    model = graph(layers, "Relu", shape)
    x = np.random.default_rng(7).normal(size=shape).astype(np.float32)
    before = run(model, x)
    assert [(a.name, b.name) for a, b in equalizable_pairs(model)] == [
        ("layer0", "layer1"),
        ("layer1", "layer2"),
    ]
    assert equalize(model) == ["layer0 -> layer1", "layer1 -> layer2"]
    np.testing.assert_allclose(run(model, x), before, rtol=1e-4, atol=1e-4)
    weights = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    # the last pair equalized: layer1's output channels and layer2's input channels share their ranges
    first, second = weights["w1"], weights["w2"]
    out_axis = 1 if layers[1][0] == "Gemm" and not layers[1][2].get("transB") else 0
    in_axis = 0 if layers[2][0] == "Gemm" and not layers[2][2].get("transB") else 1
    r1 = np.abs(np.moveaxis(first, out_axis, 0)).reshape(first.shape[out_axis], -1).max(axis=1)
    r2 = np.abs(np.moveaxis(second, in_axis, 0)).reshape(second.shape[in_axis], -1).max(axis=1)
    np.testing.assert_allclose(r1, r2, rtol=1e-5)


def test_cle_pairs_a_depthwise_layer_as_the_second_through_its_own_kernels() -> None:
    model = graph(DEPTHWISE_SEPARABLE[:2], "Relu", [4, 3, 6, 6])
    assert equalize(model) == ["layer0 -> layer1"]
    weights = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    r1 = np.abs(weights["w0"]).reshape(8, -1).max(axis=1)
    np.testing.assert_allclose(r1, np.abs(weights["w1"]).reshape(8, -1).max(axis=1), rtol=1e-5)


def test_cle_leaves_a_relu6_pair_alone() -> None:
    model = graph(DEPTHWISE_SEPARABLE, "Clip", [4, 3, 6, 6])
    assert equalizable_pairs(model) == [] and equalize(model) == []


def test_adaround_learns_a_depthwise_layers_rounding_on_its_grid() -> None:
    model = graph(DEPTHWISE_SEPARABLE, "Relu", [4, 3, 6, 6])
    images = np.random.default_rng(8).normal(size=(16, 3, 6, 6)).astype(np.float32)
    spec = QuantSpec(DtypeConfig("int8", "int8"), CalibConfig("minmax"), per_channel=True)
    flipped = adaround(model, images, spec, iterations=40, batch=8, seed=0)
    assert set(flipped) == {"layer0", "layer1", "layer2"}
    for node, weight in quantized_weights(model).values():  # every learned weight lies on its grid
        grid = weight_grid(weight, channel_axis(node), spec, 8)
        np.testing.assert_allclose(grid.dequantize(grid.quantize(weight)), weight, rtol=0, atol=1e-6)
