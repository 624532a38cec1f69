"""The TFLite toolchain on the real model and data: the sweep of the three toolchains (`sweeps`, conftest)
with MLPerf Tiny's own int8 model beside them, checked against independent LiteRT runs; TFLite's integer
arithmetic in the reference kernels; a per-tensor 16x8 conversion read back; a refused configuration."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.interpreter import Interpreter, OpResolverType
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from resnet8ptq.backends.tflite.backend import TFLiteBackend
from resnet8ptq.calibration import CalibConfig
from resnet8ptq.data import Cifar10, calibration_set, to_model_input
from resnet8ptq.dtype import DtypeConfig
from resnet8ptq.model import CanonicalModel
from resnet8ptq.spec import QuantSpec
from tests.integration.conftest import Sweeps

pytestmark = pytest.mark.slow

FP32_CORRECT = 8719  # the .h5's documented top-1 on the 10,000 test images (shared/README.md)
FP32_TOLERANCE_IMAGES = 5  # the FP32 baseline runs LiteRT's default float kernels, which may differ by CPU
INT8_MAX_LOSS_POINTS = 1.0  # 8-bit min-max PTQ of this model loses less than a point in every toolchain


def child(sweeps: Sweeps, **tags: str) -> Run:
    (run,) = [r for r in sweeps.children if all(r.data.tags.get(k) == v for k, v in tags.items())]
    return run


def artifact(sweeps: Sweeps, run: Run, path: str, tmp_path: Path) -> Path:
    return Path(sweeps.client.download_artifacts(run.info.run_id, path, str(tmp_path)))


def mlperf_input(test_images_uint8: np.ndarray) -> np.ndarray:
    """MLPerf Tiny's own preprocessing for its int8 model (tflite_test.py): pixels - 128 as int8."""
    return (test_images_uint8.astype(np.int64) - 128).astype(np.int8)


def predictions(path: Path, images: np.ndarray, resolver: OpResolverType) -> np.ndarray:
    """Class predictions of a .tflite with an int8 input, straight from the LiteRT interpreter."""
    interpreter = Interpreter(model_path=str(path), experimental_op_resolver_type=resolver)
    index = interpreter.get_input_details()[0]["index"]
    output = interpreter.get_output_details()[0]["index"]
    classes = []
    for start in range(0, len(images), 500):
        batch = images[start : start + 500]
        interpreter.resize_tensor_input(index, list(batch.shape))
        interpreter.allocate_tensors()
        interpreter.set_tensor(index, batch)
        interpreter.invoke()
        classes.append(interpreter.get_tensor(output).argmax(axis=1))
    return np.concatenate(classes)


def test_three_toolchains_and_mlperf_side_by_side(sweeps: Sweeps) -> None:
    """`run.py -m backend=onnx,torch,tflite dtype=int8 per_channel=true device=integer`: every run FINISHED,
    and the report puts each toolchain's int8 beside MLPerf Tiny's model (run on the device too), on the full
    test set and the perf subset, by their accuracy on the device."""
    assert sweeps.first.info.status == "FINISHED"
    assert {r.info.status for r in sweeps.children} == {"FINISHED"}
    report = (Path(sweeps.first.data.tags["sweep_dir"]) / "report.md").read_text()
    section = report.split("## Published models")[1].split("\n## ")[0]
    published = child(sweeps, reference="mlperf")
    for run in [published] + [
        child(sweeps, backend=b, quantized="true", per_channel="true") for b in ("onnx", "torch", "tflite")
    ]:
        metrics = run.data.metrics
        label = (
            "mlperf int8 (published)"
            if run is published
            else f"{run.data.tags['backend']} int8 minmax per-channel @int"  # device=integer
        )
        row = f"| {label} | {100 * metrics['accuracy_device']:.2f} |"  # a device sweep compares on the device
        assert row in section, row
        line = next(line for line in section.splitlines() if line.startswith(row))
        assert f"| {100 * metrics['accuracy_device_perf_subset']:.1f} |" in line


def test_tflite_int8_run(sweeps: Sweeps, tmp_path: Path) -> None:
    """Its accuracy is within a point of FP32, the LiteRT FP32 model's is the .h5's, its types are read back
    (and are what the interpreter reports for the logged file), its integer kernels were checked."""
    fp32 = child(sweeps, backend="tflite", quantized="false").data.metrics["accuracy"]
    assert abs(fp32 * 10_000 - FP32_CORRECT) <= FP32_TOLERANCE_IMAGES, fp32
    run = child(sweeps, backend="tflite", quantized="true", per_channel="true")
    metrics, tags = run.data.metrics, run.data.tags
    assert metrics["accuracy"] >= FP32_CORRECT / 10_000 - INT8_MAX_LOSS_POINTS / 100, metrics["accuracy"]
    assert metrics["accuracy"] == metrics["accuracy_reference"]
    assert "accuracy_native" in metrics and tags["execution"] in ("native", "native-mismatch")
    assert "XNNPACK" in tags["execution_reason"] or "built-in" in tags["execution_reason"]
    assert [tags[f"dtype.{k}"] for k in ("activation", "weight", "activation_bits", "weight_bits")] == [
        "int8", "int8", "8", "8",
    ]  # fmt: skip
    assert tags["weight_granularity"] == "per-channel"
    interpreter = Interpreter(model_path=str(artifact(sweeps, run, "model/model_quantized.tflite", tmp_path)))
    assert interpreter.get_input_details()[0]["dtype"] == np.int8
    weights = [
        t for t in interpreter.get_tensor_details() if len(t["shape"]) in (2, 4) and t["dtype"] == np.int8
    ]
    weights = [t for t in weights if len(t["quantization_parameters"]["scales"]) > 1]
    assert len(weights) == 10, "9 convolutions and the dense layer, each with a scale per output channel"
    assert all(len(t["quantization_parameters"]["scales"]) == t["shape"][0] for t in weights)


def test_mlperf_reference_run(sweeps: Sweeps, cifar: Cifar10, assets_dir: Path) -> None:
    """MLPerf Tiny's model takes int8 pixels - 128 (input scale 1, zero point -128): the run's native accuracy
    is what its own recipe gives on LiteRT's default kernels, its perf-subset accuracy what the reference
    kernels give on the 200 images MLPerf lists."""
    run = child(sweeps, reference="mlperf")
    assert (run.data.tags["backend"], run.data.tags["quantized"]) == ("tflite", "true")
    assert run.data.tags["model.sha256"] == "3c002613d1b2475eb51dd78dfb85a546c8ae658dee71cf6ade43b022fe205415"
    path = assets_dir / "models" / "pretrainedResnet_quant.tflite"
    details = Interpreter(model_path=str(path)).get_input_details()[0]
    assert details["dtype"] == np.int8 and details["quantization"] == (1.0, -128)
    labels = np.asarray(cifar.test_labels)
    native = predictions(path, mlperf_input(cifar.test_images), OpResolverType.AUTO)
    assert float(np.mean(native == labels)) == run.data.metrics["accuracy_native"]
    subset = np.load(assets_dir / "models" / "mlperf_perf_samples_idxs.npy")
    assert sorted(np.bincount(labels[subset])) == [20] * 10, "20 images per class"
    reference = predictions(path, mlperf_input(cifar.test_images[subset]), OpResolverType.BUILTIN_REF)
    assert float(np.mean(reference == labels[subset])) == run.data.metrics["accuracy_perf_subset"]


def test_layer_names_are_the_onnx_backends(sweeps: Sweeps, tmp_path: Path) -> None:
    """Per-layer SQNR names its layers as the ONNX backend does (the TF op names tf2onnx keeps), apart from
    the two tensors the ONNX model names otherwise (its softmax output is `dense`, its dense weight
    `dense_1/Cast`)."""
    names = {}
    for backend in ("onnx", "tflite"):
        run = child(sweeps, backend=backend, quantized="true", per_channel="true")
        table = pd.read_csv(artifact(sweeps, run, "analysis/layer_sqnr.csv", tmp_path / backend))
        names[backend] = set(table["layer"])
    assert names["tflite"] - names["onnx"] == {"softmax", "dense_1/MatMul"}
    assert len(names["tflite"]) >= 20


def test_perf_subset_metric_on_every_run(
    sweeps: Sweeps, cifar: Cifar10, assets_dir: Path, tmp_path: Path
) -> None:
    """Every run has `accuracy_perf_subset`, a count out of 200; for the ONNX FP32 run it is what ONNX Runtime
    predicts on those 200 images."""
    for run in sweeps.children:
        value = run.data.metrics["accuracy_perf_subset"]
        assert round(value * 200) == pytest.approx(value * 200, abs=1e-9), run.info.run_name
    from resnet8ptq.backends.onnx.backend import predictor, session

    fp32 = child(sweeps, backend="onnx", quantized="false")
    subset = np.load(assets_dir / "models" / "mlperf_perf_samples_idxs.npy")
    onnx_path = Path(sweeps.client.download_artifacts(fp32.info.run_id, "model", str(tmp_path)))
    (model,) = onnx_path.glob("*.onnx")
    classes = predictor(session(model))(to_model_input(cifar.test_images[subset])).argmax(axis=1)
    assert (
        float(np.mean(classes == np.asarray(cifar.test_labels)[subset]))
        == fp32.data.metrics["accuracy_perf_subset"]
    )


def tflite_conv_int8(inputs: np.ndarray, op: object, tensors: list, interpreter: Interpreter) -> np.ndarray:
    """TFLite's CONV_2D on int8 with per-channel int8 weights (stride 1, SAME), as its quantization spec
    defines it: int32 accumulation of (input - input_zero_point) x weight + bias, then the fixed-point
    multiplier of input_scale x weight_scale / output_scale (QuantizeMultiplier, double rounding:
    SaturatingRoundingDoublingHighMul then RoundingDivideByPOT), + output_zero_point, clamped."""
    x_index, w_index, b_index = (int(i) for i in op.inputs)
    detail = {d["index"]: d for d in interpreter.get_tensor_details()}
    x_zp = int(detail[x_index]["quantization_parameters"]["zero_points"][0])
    x_scale = float(detail[x_index]["quantization_parameters"]["scales"][0])
    weights = interpreter.get_tensor(w_index).astype(np.int64)  # (out, kh, kw, in)
    w_scales = detail[w_index]["quantization_parameters"]["scales"].astype(np.float64)
    bias = interpreter.get_tensor(b_index).astype(np.int64)
    out = detail[int(op.outputs[0])]["quantization_parameters"]
    y_scale, y_zp = float(out["scales"][0]), int(out["zero_points"][0])
    options = op.builtinOptions
    assert (options.strideH, options.strideW, options.padding) == (1, 1, schema.Padding.SAME)
    kernel = weights.shape[1]
    x = np.pad(inputs.astype(np.int64) - x_zp, ((0, 0), (kernel // 2,) * 2, (kernel // 2,) * 2, (0, 0)))
    n, h, w, _ = inputs.shape
    acc = np.zeros((n, h, w, weights.shape[0]), np.int64) + bias
    for dy in range(kernel):
        for dx in range(kernel):
            acc += np.einsum("nhwc,oc->nhwo", x[:, dy : dy + h, dx : dx + w], weights[:, dy, dx])
    fraction, shift = np.frexp(np.float64(x_scale) * w_scales / np.float64(y_scale))
    multiplier = np.floor(fraction * (1 << 31) + 0.5).astype(np.int64)  # fractions are positive
    shift = np.where(multiplier == 1 << 31, shift + 1, shift)
    multiplier = np.where(multiplier == 1 << 31, multiplier // 2, multiplier)
    product = (acc << np.maximum(shift, 0)) * multiplier  # SaturatingRoundingDoublingHighMul
    nudged = product + np.where(product >= 0, 1 << 30, 1 - (1 << 30))
    high = np.where(nudged >= 0, nudged // (1 << 31), -((-nudged) // (1 << 31)))
    exponent = np.maximum(-shift, 0)  # RoundingDivideByPOT
    mask = (np.int64(1) << exponent) - 1
    remainder, threshold = high & mask, (mask >> 1) + (high < 0)
    result = (high >> exponent) + (remainder > threshold) + y_zp
    low = y_zp if options.fusedActivationFunction == schema.ActivationFunctionType.RELU else -128
    return np.clip(result, max(low, -128), 127)


def test_reference_kernels_compute_tflite_integer_arithmetic(
    sweeps: Sweeps, cifar: Cifar10, tmp_path: Path
) -> None:
    """The reference form (LiteRT's BUILTIN_REF kernels) is TFLite's integer arithmetic, bit for bit: the
    first three convolutions (two with a fused ReLU) of the logged model, recomputed from their definition."""
    run = child(sweeps, backend="tflite", quantized="true", per_channel="true")
    path = artifact(sweeps, run, "model/model_quantized.tflite", tmp_path)
    graph = schema.ModelT.InitFromPackedBuf(path.read_bytes(), 0).subgraphs[0]
    images = mlperf_input(cifar.test_images[:8])  # input scale 1, zero point -128 (calibrated on 0..255)
    interpreter = Interpreter(
        model_path=str(path),
        experimental_op_resolver_type=OpResolverType.BUILTIN_REF,
        experimental_preserve_all_tensors=True,
    )
    index = interpreter.get_input_details()[0]["index"]
    assert interpreter.get_input_details()[0]["quantization"] == (1.0, -128)
    interpreter.resize_tensor_input(index, list(images.shape))
    interpreter.allocate_tensors()
    interpreter.set_tensor(index, images)
    interpreter.invoke()
    for op in graph.operators[:3]:
        expected = tflite_conv_int8(interpreter.get_tensor(int(op.inputs[0])), op, graph.tensors, interpreter)
        np.testing.assert_array_equal(interpreter.get_tensor(int(op.outputs[0])), expected)


@pytest.fixture(scope="module")
def per_tensor_16x8(
    canonical_model: CanonicalModel, cifar: Cifar10, tmp_path_factory: pytest.TempPathFactory
):
    """`dtype=a16w8 per_channel=false` converted from the .h5 (read back, not evaluated): the sweep's model
    is int8 per-channel, this one covers the other mode and the other granularity in one conversion."""
    calibration, _ = calibration_set(cifar, 100, 42)
    spec = QuantSpec(
        DtypeConfig("uint8", "int8", activation_bits=16), CalibConfig("minmax"), per_channel=False
    )
    backend = TFLiteBackend(native=False, mlperf_reference=False)
    return backend.quantize(canonical_model.source_path, calibration, spec, tmp_path_factory.mktemp("16x8"))


def test_16x8_per_tensor_read_back(per_tensor_16x8) -> None:
    """TFLite's 16x8 mode: symmetric int16 activations (zero point 0), int8 weights with one scale each
    (the converter's per-tensor switch took effect), as the interpreter reports the saved file."""
    model = per_tensor_16x8
    assert (model.activation_dtype, model.weight_dtype) == ("int16", "int8")
    assert (model.activation_bits, model.weight_bits, model.tags["weight_granularity"]) == (
        16,
        8,
        "per-tensor",
    )
    details = Interpreter(model_path=str(model.path)).get_tensor_details()
    activations = [t for t in details if t["dtype"] == np.int16]
    assert len(activations) > 10
    assert all(not t["quantization_parameters"]["zero_points"].any() for t in activations)
    weights = [
        t for t in details if t["name"].endswith(("/convolution", "/MatMul")) and t["dtype"] == np.int8
    ]
    assert len(weights) == 10 and all(len(t["quantization_parameters"]["scales"]) == 1 for t in weights)


def test_refused_configuration_fails_with_what_it_can_run(
    run_cli, initialised_store: Path, tmp_path: Path
) -> None:
    shutil.copy(initialised_store, tmp_path / "mlflow.db")
    result = run_cli(tmp_path, "backend=tflite", "calib=entropy")
    assert result.returncode == 1
    assert "Unsupported: backend=tflite runs dtype=int8" in result.stderr
    assert "has no entropy calibration. Use calib=minmax." in result.stderr
    store = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (parent,) = store.search_runs([store.get_experiment_by_name("resnet8ptq").experiment_id])
    assert parent.info.status == "FAILED", "a refused single run ends its parent FAILED"
    assert parent.data.tags["error"].startswith("Unsupported: backend=tflite runs dtype=int8")
