"""Bad model files are refused with the fix named; computed Reshape targets become constants."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from resnet8ptq import model as model_module
from resnet8ptq.errors import ModelError
from resnet8ptq.model import MODEL_SHA256, resolve_source


def test_non_hdf5_file_is_refused(tmp_path: Path) -> None:
    bogus = tmp_path / "model.h5"
    bogus.write_text("not a model")
    with pytest.raises(ModelError, match="not an HDF5 file"):
        resolve_source(bogus, None, tmp_path)


def test_missing_model_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="does not exist"):
        resolve_source(tmp_path / "nope.h5", None, tmp_path)


def test_failed_download_names_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(model_module.ASSETS_ENV, raising=False)
    with pytest.raises(ModelError, match="RESNET8PTQ_ASSETS"):
        resolve_source(None, MODEL_SHA256, tmp_path / "cache", url=(tmp_path / "absent.h5").as_uri())
    assert not any((tmp_path / "cache" / "models").iterdir())


def test_computed_reshape_target_becomes_constant() -> None:
    """tf2onnx sometimes emits the flatten as Shape -> Gather -> Unsqueeze -> Concat -> Reshape."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["batch"], axis=0),
        helper.make_node("Unsqueeze", ["batch", "axes"], ["batch_1d"]),
        helper.make_node("Concat", ["batch_1d", "features"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    constants = [
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
        numpy_helper.from_array(np.array([0], np.int64), "axes"),
        numpy_helper.from_array(np.array([4], np.int64), "features"),
    ]
    graph = helper.make_graph(
        nodes,
        "flatten",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 1, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        constants,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    static = model_module.static_reshapes(model)
    assert [node.op_type for node in static.graph.node] == ["Reshape"]
    assert [init.name for init in static.graph.initializer] == ["y/static_shape"]
    x = np.arange(12, dtype=np.float32).reshape(3, 4, 1, 1)
    session = ort.InferenceSession(static.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], x.reshape(3, 4))


def test_folded_reshape_target_gets_the_same_name_on_every_conversion() -> None:
    """A flatten that TensorFlow folded into a constant named by tf2onnx's counter: two conversions that
    count differently give the same model bytes, and applying it again changes nothing."""
    from onnx import TensorProto, helper, numpy_helper

    def converted(counter: int) -> bytes:
        shape = numpy_helper.from_array(np.array([-1, 4], np.int64), f"flatten/Reshape_shape__{counter}")
        graph = helper.make_graph(
            [helper.make_node("Reshape", ["x", shape.name], ["y"])],
            "flatten",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 1, 1])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
            [shape],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
        return model_module.static_reshapes(model).SerializeToString(deterministic=True)

    assert converted(147) == converted(148)
    static = onnx.load_from_string(converted(147))
    assert [(init.name, numpy_helper.to_array(init).tolist()) for init in static.graph.initializer] == [
        ("y/static_shape", [-1, 4])
    ]
    again = model_module.static_reshapes(onnx.load_from_string(converted(147)))
    assert again.SerializeToString(deterministic=True) == converted(147)


def test_unknown_dims_are_numbered_the_same_on_every_conversion() -> None:
    """tf2onnx names the unknown batch dimension by its counter; the canonical model numbers them itself."""
    from onnx import TensorProto, helper

    def converted(counter: int) -> bytes:
        graph = helper.make_graph(
            [helper.make_node("Relu", ["x"], ["y"])],
            "relu",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [f"unk__{counter}", 4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [f"unk__{counter}", "width"])],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
        return model_module.numbered_dims(model).SerializeToString(deterministic=True)

    assert converted(148) == converted(149)
    output = onnx.load_from_string(converted(148)).graph.output[0]
    assert [dim.dim_param for dim in output.type.tensor_type.shape.dim] == [
        "unk_0",
        "width",
    ]  # own names kept


def test_weights_stored_in_int8_become_the_float_weights_they_define() -> None:
    """A converted .tflite's DequantizeLinear of int8 weights (per channel, as MLPerf Tiny's KWS model holds)
    folds into the float constant: the graph computes the same, with no DequantizeLinear left."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from resnet8ptq.model import dequantized_constants

    rng = np.random.default_rng(0)
    weights = rng.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8)
    scales = rng.uniform(0.001, 0.01, 4).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zp"], ["w"], axis=0),
            helper.make_node("Conv", ["input", "w"], ["output"]),
        ],
        "g",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 4, 6, 6])],
        [
            numpy_helper.from_array(weights, "w_q"),
            numpy_helper.from_array(scales, "w_scale"),
            numpy_helper.from_array(np.zeros(4, np.int8), "w_zp"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    images = rng.random((2, 3, 8, 8), dtype=np.float32)
    before = ort.InferenceSession(model.SerializeToString()).run(None, {"input": images})[0]
    folded = dequantized_constants(model)
    assert [node.op_type for node in folded.graph.node] == ["Conv"]
    after = ort.InferenceSession(folded.SerializeToString()).run(None, {"input": images})[0]
    np.testing.assert_allclose(after, before, rtol=1e-6, atol=1e-6)


def test_a_static_squeeze_becomes_a_reshape() -> None:
    """Keras' GlobalAveragePooling2D converts to GlobalAveragePool -> Squeeze, whose axes onnx2torch reads at
    run time (torch.export refuses that as data-dependent): with a static output it becomes a Reshape to
    [-1, C], computing the same."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from resnet8ptq.model import static_reshapes

    graph = helper.make_graph(
        [
            helper.make_node("GlobalAveragePool", ["input"], ["pooled"]),
            helper.make_node("Squeeze", ["pooled", "axes"], ["output"]),
        ],
        "g",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 4, 5, 5])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 4])],
        [numpy_helper.from_array(np.array([2, 3], np.int64), "axes")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    images = np.random.default_rng(0).random((3, 4, 5, 5), dtype=np.float32)
    before = ort.InferenceSession(model.SerializeToString()).run(None, {"input": images})[0]
    static = static_reshapes(model)
    assert [node.op_type for node in static.graph.node] == ["GlobalAveragePool", "Reshape"]
    assert [init.name for init in static.graph.initializer] == ["output/static_shape"]  # the axes dropped
    after = ort.InferenceSession(static.SerializeToString()).run(None, {"input": images})[0]
    np.testing.assert_array_equal(after, before)


def dense_batchnorm(shared_weight: bool = False) -> onnx.ModelProto:
    """Keras' Dense -> BatchNormalization -> ReLU as tf2onnx writes it: Gemm, Mul, Add, Relu (two of them
    when ``shared_weight``, the second Gemm reading the first's weights)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    constants = [
        numpy_helper.from_array(rng.normal(size=(6, 4)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.normal(size=4).astype(np.float32), "b"),
        numpy_helper.from_array(rng.uniform(0.5, 2, (1, 4)).astype(np.float32), "bn/mul"),
        numpy_helper.from_array(rng.normal(size=(1, 4)).astype(np.float32), "bn/sub"),
    ]
    nodes = [
        helper.make_node("Gemm", ["x", "w", "b"], ["dense"]),
        helper.make_node("Mul", ["dense", "bn/mul"], ["scaled"]),
        helper.make_node("Add", ["scaled", "bn/sub"], ["shifted"]),
        helper.make_node("Relu", ["shifted"], ["y"]),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])]
    if shared_weight:
        nodes.append(helper.make_node("Gemm", ["x", "w", "b"], ["z"]))
        outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 4]))
    graph = helper.make_graph(
        nodes,
        "dense_bn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])],
        outputs,
        constants,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_batchnorm_after_a_dense_layer_folds_into_it() -> None:
    import onnxruntime as ort

    from resnet8ptq.batchnorm_fold import fold_into_dense

    model = dense_batchnorm()
    x = np.random.default_rng(1).normal(size=(5, 6)).astype(np.float32)
    expected = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    folded = fold_into_dense(model)
    assert [node.op_type for node in folded.graph.node] == ["Gemm", "Relu"]
    assert sorted(init.name for init in folded.graph.initializer) == ["b", "w"]
    got = ort.InferenceSession(folded.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_weights_another_layer_reads_are_not_folded() -> None:
    from resnet8ptq.batchnorm_fold import fold_into_dense

    folded = fold_into_dense(dense_batchnorm(shared_weight=True))
    assert [node.op_type for node in folded.graph.node] == ["Gemm", "Mul", "Add", "Relu", "Gemm"]
