"""The TFLite backend's pure logic: what it refuses and why, TFLite's input quantization, reading a model's
tensors (granularity, widths, layer names), which ops the XNNPACK delegate took; MLPerf Tiny's subset file."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from resnet8ptq import mlperf
from resnet8ptq.backends.tflite.backend import TFLiteBackend, check_spec, kernel_summary
from resnet8ptq.backends.tflite.flatbuffer import (
    Tensor,
    TFLiteModel,
    layer_precision,
    tflite_layer_name,
    weight_granularity,
)
from resnet8ptq.backends.tflite.litert_runner import dequantize, quantize
from resnet8ptq.calibration import CalibConfig
from resnet8ptq.dtype import DtypeConfig
from resnet8ptq.errors import DataError, Unsupported
from resnet8ptq.evaluate import Evaluation
from resnet8ptq.spec import QuantSpec, base_precision

MINMAX = CalibConfig("minmax")


def spec(activation: str = "int8", weight: str = "int8", **kwargs) -> QuantSpec:
    bits = {k: kwargs.pop(k) for k in ("activation_bits", "weight_bits", "first_last_bits") if k in kwargs}
    return QuantSpec(DtypeConfig(activation, weight, **bits), kwargs.pop("calib", MINMAX), **kwargs)


@pytest.mark.parametrize(
    "accepted",
    [
        spec(),
        spec(per_channel=True),
        spec("uint8", "int8", activation_bits=16),  # dtype=a16w8: TFLite's 16x8 (int16 activations)
        spec("int8", "int8", activation_bits=16),
        spec(calib=CalibConfig("minmax", batch_size=10)),
    ],
)
def test_what_the_converter_makes_is_accepted(accepted: QuantSpec) -> None:
    check_spec(accepted)


@pytest.mark.parametrize(
    ("refused", "reason"),
    [
        (spec("uint8", "uint8"), "not uint8-uint8: its converter has no other integer types or widths."),
        (spec("uint8", "int8"), "not uint8-int8"),
        (spec(weight_bits=4), "not int8-int4"),
        (spec(activation_bits=6), "not int6-int8"),
        (spec("uint8", "uint8", activation_bits=16), "not uint16-uint8"),
        (spec(reduce_range=True), "it has no reduce_range (7-bit weights)"),
        (
            spec(calib=CalibConfig("entropy", num_bins=2048, num_quantized_bins=128)),
            "has no entropy calibration",
        ),
        (
            spec(calib=CalibConfig("percentile", num_bins=2048, percentile=99.9)),
            "has no percentile calibration",
        ),
        (spec(calib=CalibConfig("minmax", symmetric=True)), "calib.symmetric=true cannot be expressed"),
        (spec(raised_layers=("activation_6_1/Relu",)), "no mixed precision (raised_layers)"),
        (spec(first_last_bits=8), "no layer of its own width (dtype.first_last_bits)"),
        (spec(calib=CalibConfig("mse", num_bins=2048)), "has no mse calibration"),
        (spec(calib=CalibConfig("minmax", weights="mse")), "cannot clip it"),
    ],
)
def test_refusals_name_what_it_runs(refused: QuantSpec, reason: str) -> None:
    with pytest.raises(Unsupported) as raised:
        check_spec(refused)
    message = str(raised.value)
    assert message.startswith("backend=tflite runs dtype=int8 (int8 activations and weights")
    assert "dtype=a16w8 (TFLite's 16x8 mode" in message and reason in message
    assert "\n" not in message


def test_algorithms_cannot_reach_a_backend_that_starts_from_the_h5() -> None:
    backend = TFLiteBackend(native=False, threads=1, mlperf_reference=False)
    backend.check_algorithms([])
    with pytest.raises(
        Unsupported, match=r"converts the Keras .h5 itself, .*\(cle, bias_correction\).*algo=none"
    ):
        backend.check_algorithms(["cle", "bias_correction"])


def test_input_quantization_rounds_half_away_from_zero_and_saturates() -> None:
    """TFLite's QUANTIZE: round(x / scale) + zero_point with std::round, clamped to the type."""
    values = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 300.0, -300.0], np.float32)
    np.testing.assert_array_equal(quantize(values, 1.0, 0, np.int8), [1, 2, 3, -1, -2, 127, -128])
    pixels = np.arange(256, dtype=np.float32)  # MLPerf's input: scale 1, zero point -128 -> pixel - 128
    np.testing.assert_array_equal(quantize(pixels, 1.0, -128, np.int8), np.arange(-128, 128))
    np.testing.assert_allclose(dequantize(np.array([-128, 0, 127], np.int8), 0.5, -128), [0.0, 64.0, 127.5])


def tensor(index: int, name: str, dtype: str = "int8", scales=(0.1,), values=None, shape=(1,)) -> Tensor:
    scales = np.asarray(scales, np.float32)
    return Tensor(index, name, dtype, shape, scales, np.zeros(len(scales), np.int64), 0, values)


def small_model() -> TFLiteModel:
    """input -> CONV_2D (per-channel weight) -> FULLY_CONNECTED (per-tensor weight) -> SOFTMAX."""
    tensors = [
        tensor(0, "serving_default_input_1:0"),
        tensor(
            1, "model_1/conv2d_1/convolution", scales=(0.1, 0.2), values=np.array([[-90, 3], [5, 7]], np.int8)
        ),
        tensor(
            2,
            "model_1/activation_1/Relu;model_1/batch_normalization_1/batchnorm/add_1;model_1/conv2d_1/BiasAdd",
        ),
        tensor(3, "model_1/dense_1/MatMul", values=np.array([[100, -4]], np.int8)),
        tensor(4, "model_1/dense_1/MatMul;model_1/dense_1/BiasAdd"),
        tensor(5, "StatefulPartitionedCall_1:0"),
    ]
    ops = [("CONV_2D", [0, 1], [2]), ("FULLY_CONNECTED", [2, 3], [4]), ("SOFTMAX", [4], [5])]
    return TFLiteModel(ops, tensors, [0])


def test_granularity_and_widths_read_from_the_tensors() -> None:
    model = small_model()
    assert weight_granularity(model) == "per-channel x1, per-tensor x1 (model_1/dense_1/MatMul)"
    layers = layer_precision(model)
    assert base_precision(layers, "activation") == ("int8", 8)
    assert base_precision(layers, "weight") == ("int8", 8), "-90..7, -4..100: 8 signed bits each"


def test_layer_names_follow_the_onnx_models() -> None:
    model = small_model()
    assert tflite_layer_name(model, 0) == "input"
    assert tflite_layer_name(model, 2) == "activation_1/Relu"
    assert tflite_layer_name(model, 4) == "dense_1/BiasAdd"
    assert tflite_layer_name(model, 5) == "softmax", "the output has no TF op name"
    precision = {(layer.layer, layer.kind): (layer.dtype, layer.bits) for layer in layer_precision(model)}
    assert precision[("activation_1/Relu", "activation")] == ("int8", 8)
    assert precision[("conv2d_1", "weight")] == ("int8", 8) and precision[("dense_1/MatMul", "weight")] == (
        "int8",
        8,
    )
    assert len(precision) == 6, "4 activations (input included), 2 weights"


def test_kernel_summary_reads_the_delegate_partitions() -> None:
    """A DELEGATE node replaces the ops between its inputs and outputs; the others stay built-in."""
    model = small_model()
    nodes = [{"op_name": op, "inputs": inputs, "outputs": outputs} for op, inputs, outputs in model.ops] + [
        {"op_name": "DELEGATE", "inputs": [0, 1, 3], "outputs": [4]}
    ]
    runner = SimpleNamespace(interpreter=SimpleNamespace(_get_ops_details=lambda: nodes))
    summary = kernel_summary(runner, model)
    assert summary.startswith("LiteRT's XNNPACK delegate runs 2/3 ops in 1 partition(s)")
    assert "(CONV_2D x1, FULLY_CONNECTED x1); built-in kernels: SOFTMAX x1" in summary
    plain = SimpleNamespace(interpreter=SimpleNamespace(_get_ops_details=lambda: nodes[:3]))
    assert kernel_summary(plain, model).startswith("the XNNPACK delegate took no op")


def test_subset_accuracy_uses_the_same_predictions() -> None:
    evaluation = Evaluation(np.array([0, 1, 2, 3]), np.array([0, 1, 0, 0]), np.zeros((4, 10)), 1.0)
    assert evaluation.subset_accuracy(np.array([0, 2])) == 0.5 and evaluation.accuracy == 0.5
    assert evaluation.subset_accuracy(np.array([1])) == 1.0


@pytest.fixture
def assets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An assets directory of this test's own, and a fresh read of the subset file."""
    monkeypatch.setenv("RESNET8PTQ_ASSETS", str(tmp_path))
    (tmp_path / "models").mkdir()
    mlperf.perf_subset_indices.cache_clear()
    yield tmp_path / "models"
    mlperf.perf_subset_indices.cache_clear()


def test_subset_file_with_another_checksum_is_refused(assets: Path, tmp_path: Path) -> None:
    np.save(assets / mlperf.PERF_SUBSET_FILENAME, np.arange(200))
    with pytest.raises(
        DataError,
        match=r"does not match that of MLPerf Tiny's performance-subset indices .*perf_samples_idxs\.npy",
    ):
        mlperf.perf_subset_indices(tmp_path / "cache")


def test_failed_subset_download_names_the_fix(assets: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(mlperf, "PERF_SUBSET_URL", (tmp_path / "absent.npy").as_uri())
    monkeypatch.delenv("RESNET8PTQ_ASSETS")
    with pytest.raises(
        DataError, match="RESNET8PTQ_ASSETS to a directory holding models/mlperf_perf_samples"
    ):
        mlperf.perf_subset_indices(tmp_path / "cache")
    assert not any((tmp_path / "cache" / "models").iterdir()), "nothing half-written"
