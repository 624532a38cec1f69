"""PyTorch backend on the real model and the full CIFAR-10 test set: FP32 parity with ONNX Runtime, PT2E
quantization per dtype pair, reload in a fresh process, and calibration ranges identical to ORT's."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torchao")
pytest.importorskip("onnx2torch")

from resnet8ptq import hardware
from resnet8ptq.backends.base import QuantizedModel
from resnet8ptq.backends.torch.backend import TorchBackend
from resnet8ptq.backends.torch.convert import load_program, load_quantized
from resnet8ptq.backends.torch.program import qdq_counts, quantized_weights
from resnet8ptq.calibration import CalibConfig, batches
from resnet8ptq.data import Cifar10, calibration_set, to_model_input
from resnet8ptq.dtype import DtypeConfig
from resnet8ptq.execution import NATIVE, NATIVE_MISMATCH, judge
from resnet8ptq.model import CanonicalModel
from resnet8ptq.spec import QuantSpec

FP32_CORRECT = 8719
MIN_QUANT_ACCURACY = 0.855
TOLERANCE_POINTS = 0.3  # the default native_tolerance_points
PAIRS = {  # dtype pair -> per_channel (both granularities get covered)
    ("int8", "int8"): False,
    ("uint8", "uint8"): True,
    ("uint8", "int8"): True,
}
HISTOGRAM_CALIBS = {
    "entropy": CalibConfig("entropy", num_bins=2048, num_quantized_bins=128),
    "percentile": CalibConfig("percentile", num_bins=2048, percentile=99.99),
}


def _accuracy(probs: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(probs.argmax(axis=1) == labels))


@pytest.fixture(scope="module")
def onnx_path(canonical_model: CanonicalModel) -> Path:
    return canonical_model.onnx_path


@pytest.fixture(scope="module")
def test_set(cifar: Cifar10) -> tuple[np.ndarray, np.ndarray]:
    return to_model_input(cifar.test_images), np.asarray(cifar.test_labels)


@pytest.fixture(scope="module")
def calib_images(cifar: Cifar10) -> np.ndarray:
    return calibration_set(cifar, per_class=100, seed=42)[0]


@pytest.fixture(scope="module")
def backend() -> TorchBackend:
    return TorchBackend()


@pytest.fixture(scope="module")
def fp32(backend, onnx_path, tmp_path_factory):
    return backend.load_fp32(onnx_path, tmp_path_factory.mktemp("fp32"))


@pytest.fixture(scope="module")
def quantized(backend, onnx_path, calib_images, tmp_path_factory) -> dict:
    """One minmax model per dtype pair (uint8/int8 with its compiled int8-kernel runtime form)."""
    models = {}
    for (act, weight), per_channel in PAIRS.items():
        spec = QuantSpec(DtypeConfig(act, weight), CalibConfig("minmax"), per_channel)
        workdir = tmp_path_factory.mktemp(f"q_{act}_{weight}")
        models[act, weight] = backend.quantize(onnx_path, calib_images, spec, workdir)
    return models


@pytest.fixture(scope="module")
def accuracies(quantized, test_set) -> dict:
    """Reference accuracy of each model on the full test set."""
    return {pair: _accuracy(q.reference(test_set[0]), test_set[1]) for pair, q in quantized.items()}


# --------------------------------------------------------------------------------------------- FP32


def test_fp32_matches_onnxruntime(fp32, onnx_path, test_set):
    import onnxruntime as ort

    images, labels = test_set
    probs = fp32.predict(images)
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    reference = np.concatenate([session.run(None, {"input": b})[0] for b in batches(images, 1000)])
    assert int((probs.argmax(axis=1) == labels).sum()) == FP32_CORRECT
    assert float(np.abs(probs - reference).max()) < 1e-4
    assert fp32.path.suffix == ".pt2" and fp32.path.is_file()


def test_fp32_any_batch_size(fp32, test_set):
    images = test_set[0][:7]
    whole = fp32.predict(images)
    assert whole.shape == (7, 10)
    np.testing.assert_allclose(fp32.predict(images[:1]), whole[:1], atol=1e-5)


# ---------------------------------------------------------------------------------------- quantized


@pytest.mark.parametrize("pair", list(PAIRS), ids=lambda p: "/".join(p))
def test_quantized_accuracy(pair, accuracies):
    assert accuracies[pair] >= MIN_QUANT_ACCURACY, f"{pair}: accuracy {accuracies[pair]:.4f}"


@pytest.mark.parametrize("pair", list(PAIRS), ids=lambda p: "/".join(p))
def test_quantized_file_holds_integer_ops_and_dtypes(pair, quantized):
    q: QuantizedModel = quantized[pair]
    assert (q.activation_dtype, q.weight_dtype) == pair
    program = load_program(q.path)
    counts = qdq_counts(program.graph_module)
    assert counts["quantize_per_tensor"] >= 10 and counts["dequantize_per_tensor"] >= 10, counts
    assert counts["dequantize_per_channel"] == 10, counts  # 9 conv + 1 linear weights
    expected_granularity = "per-channel" if PAIRS[pair] else "per-tensor"
    assert q.tags["weight_granularity"] == expected_granularity


@pytest.mark.parametrize("pair", list(PAIRS), ids=lambda p: "/".join(p))
def test_quantized_file_size_is_honest(pair, quantized, fp32):
    q = quantized[pair]
    size, fp32_size = q.path.stat().st_size, fp32.path.stat().st_size
    assert q.metrics["weights_bytes"] < 100_000  # ~78k int8 weights + scales and float biases
    assert size < 0.6 * fp32_size, (size, fp32_size)


@pytest.mark.parametrize("pair", list(PAIRS), ids=lambda p: "/".join(p))
def test_reference_is_the_saved_program_and_runtime_what_ran(pair, quantized, test_set):
    q = quantized[pair]
    images = test_set[0][:1000]
    eager = load_program(q.path).module()
    import torch

    with torch.inference_mode():
        saved = np.concatenate([eager(torch.from_numpy(b)).numpy() for b in batches(images, 500)])
    np.testing.assert_array_equal(q.reference(images), saved)
    if pair == ("uint8", "int8"):  # the only pair x86 integer kernels take
        assert q.runtime.integer_kernels, q.runtime.kernels
        assert "9/9 conv and 1/1 linear" in q.runtime.kernels
        assert q.metrics["compile_seconds"] > 0
        assert not np.array_equal(q.runtime.predict(images), saved)  # a different (integer) kernel ran
    else:  # no int8 kernel: the q/dq program compiled into float kernels, predicting what the reference does
        assert not q.runtime.integer_kernels and q.runtime.predict is not q.reference
        assert "take uint8 activations and int8 weights" in q.runtime.kernels
        assert "compiled by inductor into float kernels" in q.runtime.kernels
        assert q.metrics["compile_seconds"] > 0
        # A requantization rounded differently (e.g. its 1/scale folded into a conv's weights by inductor)
        # changed the class of ~9% of these images; kernels that only reorder float sums change none.
        np.testing.assert_array_equal(q.runtime.predict(images).argmax(1), saved.argmax(1))


@pytest.mark.parametrize("pair", list(PAIRS))
def test_compiled_runtime_takes_any_single_image_without_compiling_again(pair, quantized, test_set):
    """Latency feeds ``image[None]`` (stride 0 on the batch axis in numpy); dynamo guards on strides, and a
    recompile took seconds per run. The compiled runtime feeds its two compiled shapes in fresh tensors."""
    from torch._dynamo.utils import counters

    runtime = quantized[pair].runtime.predict
    images = test_set[0]
    # Both shapes once (the other pairs' compiles since reset dynamo's cache), then none may compile.
    runtime(images[:1]), runtime(images[:500])
    frames = counters["frames"]["total"]
    single = images[3][None]
    assert single.strides[0] == 0  # what numpy gives the latency loop
    np.testing.assert_array_equal(runtime(single), runtime(images[3:4]))
    runtime(images[:7])  # a partial batch: zero-padded to the compiled batch
    assert counters["frames"]["total"] == frames, "the compiled runtime was compiled again"


def test_programs_are_saved_whole_by_concurrent_processes(backend, fp32, onnx_path, tmp_path):
    """Two processes of a parallel sweep save the FP32 program to the same cache file: each writes a file
    of its own and moves it into place, so a reader never sees half a file and nothing partial is left."""
    script = (
        "import sys; from pathlib import Path; from resnet8ptq.backends.torch.backend import TorchBackend; "
        "TorchBackend().load_fp32(Path(sys.argv[1]), Path(sys.argv[2]))"
    )
    writers = [
        subprocess.Popen([sys.executable, "-c", script, str(onnx_path), str(tmp_path)]) for _ in range(2)
    ]
    assert [writer.wait(timeout=600) for writer in writers] == [0, 0]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model_fp32.pt2"]
    images = np.zeros((3, 32, 32, 3), np.float32)
    np.testing.assert_array_equal(load_quantized(tmp_path / "model_fp32.pt2")(images), fp32.predict(images))


def test_native_kernels_against_the_reference(quantized, accuracies, test_set):
    """On a CPU with an int8 dot product (VNNI/AMX) inductor's int8 kernels match the reference; without
    one (AVX2) their saturating u8 x s8 pairs lose accuracy on this model, and the rule says so."""
    q = quantized["uint8", "int8"]
    native = _accuracy(q.runtime.predict(test_set[0]), test_set[1])
    machine = hardware.detect()
    verdict = judge(
        accuracies["uint8", "int8"], native, q.runtime, TOLERANCE_POINTS, machine, ("uint8", "int8")
    )
    assert verdict.gap_points == pytest.approx(100 * (native - accuracies["uint8", "int8"]))
    if machine.has_int8_dot_product:
        assert verdict.execution == NATIVE, verdict.reason
    else:
        assert verdict.execution == NATIVE_MISMATCH, verdict.reason
        assert verdict.gap_points < -TOLERANCE_POINTS and "reduce_range=true" in verdict.reason


def test_reduce_range_native_matches_the_reference_on_any_cpu(onnx_path, calib_images, test_set, tmp_path):
    """7-bit weights keep u8 x s8 pair sums inside 16 bits: the int8 kernels match the reference on every
    CPU, and every stored weight lies in ORT's reduced range [-64, 64]."""
    spec = QuantSpec(DtypeConfig("uint8", "int8"), CalibConfig("minmax"), True, reduce_range=True)
    q = TorchBackend().quantize(onnx_path, calib_images, spec, tmp_path)
    reference = _accuracy(q.reference(test_set[0]), test_set[1])
    native = _accuracy(q.runtime.predict(test_set[0]), test_set[1])
    assert q.runtime.integer_kernels
    # Rounded to 6 decimals as execution.judge rounds: 30 images apart can compute as 0.30000000000000027.
    assert round(abs(native - reference) * 100, 6) <= TOLERANCE_POINTS, (native, reference)
    assert reference >= MIN_QUANT_ACCURACY
    weights = quantized_weights(load_program(q.path))
    assert len(weights) == 10 and all(int(w.min()) >= -64 and int(w.max()) <= 64 for w in weights)


def test_reload_in_fresh_process(quantized, accuracies, assets_dir):
    """Each saved .pt2 loaded by a new interpreter runs the simulated program: same accuracy exactly."""
    paths = {"/".join(pair): str(q.path) for pair, q in quantized.items()}
    script = (
        "import json, sys, numpy as np\n"
        "from resnet8ptq.backends.torch.convert import load_quantized\n"
        "from resnet8ptq.data import load_cifar10, to_model_input\n"
        f"data = load_cifar10({str(assets_dir)!r}, download=False)\n"
        "x, y = to_model_input(data.test_images), np.asarray(data.test_labels)\n"
        "paths = json.loads(sys.argv[1])\n"
        "acc = {k: float(np.mean(load_quantized(p)(x).argmax(1) == y)) for k, p in paths.items()}\n"
        "print(json.dumps(acc))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, json.dumps(paths)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    reloaded = json.loads(result.stdout.strip().splitlines()[-1])
    for pair in quantized:
        assert reloaded["/".join(pair)] == accuracies[pair], pair


# --------------------------------------------------------------------------------------- calibration


def _ort_ranges(onnx_path: Path, images: np.ndarray, calib: CalibConfig) -> dict[str, tuple[float, float]]:
    from onnxruntime.quantization import CalibrationDataReader, create_calibrator

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter(list(batches(images, calib.batch_size)))

        def get_next(self):
            batch = next(self.batches, None)
            return None if batch is None else {"input": batch}

    with tempfile.TemporaryDirectory() as tmp:
        calibrator = create_calibrator(
            onnx_path,
            augmented_model_path=Path(tmp) / "augmented.onnx",
            calibrate_method=calib.ort_method(),
            extra_options=calib.ort_options(),
        )
        with contextlib.redirect_stdout(io.StringIO()):
            calibrator.collect_data(Reader())
            data = calibrator.compute_data()
    return {
        name: tuple(float(np.asarray(v).reshape(-1)[0]) for v in td.range_value)
        for name, td in data.data.items()
    }


@pytest.fixture(scope="module")
def calibrated(fp32, onnx_path, calib_images, tmp_path_factory) -> dict:
    """Simulated-only uint8/int8 models for minmax, entropy and percentile (their ranges)."""
    backend = TorchBackend(native=False)
    calibs = {"minmax": CalibConfig("minmax"), **HISTOGRAM_CALIBS}
    return {
        method: backend.quantize(
            onnx_path,
            calib_images,
            QuantSpec(DtypeConfig("uint8", "int8"), calib, True),
            tmp_path_factory.mktemp(method),
        )
        for method, calib in calibs.items()
    }


@pytest.mark.parametrize("method", list(HISTOGRAM_CALIBS))
def test_ranges_equal_ort_calibrator(method, calibrated, onnx_path, calib_images):
    ort_ranges = _ort_ranges(onnx_path, calib_images, HISTOGRAM_CALIBS[method])
    torch_ranges = {r.tensor: (r.min, r.max) for r in calibrated[method].ranges}
    # The model input: torch observes it after the NHWC->NCHW transpose, the same values.
    first = "model_1/conv2d_1/BiasAdd__6:0"
    np.testing.assert_allclose(torch_ranges[first], ort_ranges["input"], rtol=1e-6, atol=1e-6)
    internal = "model_1/activation_1/Relu:0"
    np.testing.assert_allclose(torch_ranges[internal], ort_ranges[internal], rtol=1e-5, atol=1e-6)
    shared = [name for name in torch_ranges if name in ort_ranges]
    assert len(shared) == len(torch_ranges) >= 10  # every observed tensor is an ONNX tensor
    for name in shared:
        np.testing.assert_allclose(torch_ranges[name], ort_ranges[name], rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("method", list(HISTOGRAM_CALIBS))
def test_histogram_ranges_differ_from_minmax(method, calibrated):
    minmax = {r.tensor: (r.min, r.max) for r in calibrated["minmax"].ranges}
    other = {r.tensor: (r.min, r.max) for r in calibrated[method].ranges}
    assert minmax.keys() == other.keys()
    differing = [name for name in minmax if not np.allclose(minmax[name], other[name])]
    assert len(differing) >= len(minmax) // 2, differing
    assert all(other[name][1] <= minmax[name][1] + 1e-6 for name in minmax)  # clipping, never widening
