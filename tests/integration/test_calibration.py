"""Calibration methods mean what they say: entropy and percentile really differ from minmax, and the
shared RangeCollector reproduces ORT's calibrators exactly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnxruntime.quantization import create_calibrator

from resnet8ptq.backends.base import QuantizedModel
from resnet8ptq.backends.onnx.reader import ImageReader
from resnet8ptq.calibration import CalibConfig, RangeCollector, batches
from resnet8ptq.data import Cifar10, calibration_set
from resnet8ptq.dtype import DtypeConfig
from resnet8ptq.model import CanonicalModel
from resnet8ptq.spec import QuantSpec

SPECS = {
    "minmax": CalibConfig("minmax"),
    "entropy": CalibConfig("entropy", num_bins=2048, num_quantized_bins=128),
    "percentile": CalibConfig("percentile", symmetric=True, num_bins=2048, percentile=99.999),
}


@pytest.fixture(scope="module")
def calibration_images(cifar: Cifar10) -> np.ndarray:
    return calibration_set(cifar, per_class=20, seed=42)[0]


@pytest.fixture(scope="module")
def onnx_quantized(
    onnx_backend,
    canonical_model: CanonicalModel,
    calibration_images: np.ndarray,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, QuantizedModel]:
    backend = onnx_backend(native=False)
    return {
        method: backend.quantize(
            canonical_model.onnx_path,
            calibration_images,
            QuantSpec(DtypeConfig("uint8", "int8"), spec, False),
            tmp_path_factory.mktemp(method),
        )
        for method, spec in SPECS.items()
    }


@pytest.mark.parametrize("method", ["entropy", "percentile"])
def test_histogram_methods_differ_from_minmax(onnx_quantized: dict[str, QuantizedModel], method: str) -> None:
    minmax = {r.tensor: (r.min, r.max) for r in onnx_quantized["minmax"].ranges}
    other = {r.tensor: (r.min, r.max) for r in onnx_quantized[method].ranges}
    assert minmax.keys() == other.keys()
    narrower = [t for t in minmax if other[t][1] < minmax[t][1] - 1e-3 * abs(minmax[t][1])]
    # Clipping outliers is the point of both methods: most activation ranges must shrink.
    assert len(narrower) >= len(minmax) // 2, f"{method} ranges barely differ from minmax"


@pytest.mark.parametrize("method", list(SPECS))
def test_range_collector_reproduces_ort(
    method: str, canonical_model: CanonicalModel, calibration_images: np.ndarray, tmp_path: Path
) -> None:
    """The collector other backends use gives ORT's range for the same tensor and data (the model input)."""
    spec = SPECS[method]
    calibrator = create_calibrator(
        canonical_model.onnx_path,
        ["Transpose", "Conv"],
        augmented_model_path=str(tmp_path / "aug.onnx"),
        calibrate_method=spec.ort_method(),
        extra_options=spec.ort_options(),
    )
    calibrator.collect_data(ImageReader(calibration_images, spec.batch_size, "input"))
    ort_low, ort_high = (np.asarray(v).item() for v in calibrator.compute_data().data["input"].range_value)
    collector = RangeCollector(spec)
    for batch in batches(calibration_images, spec.batch_size):
        collector.add(batch)
    low, high = collector.compute()
    assert low == pytest.approx(float(ort_low), rel=1e-6, abs=1e-6)
    assert high == pytest.approx(float(ort_high), rel=1e-6)


def test_mse_ranges_agree_between_backends_and_clip(
    onnx_backend,
    canonical_model: CanonicalModel,
    calibration_images: np.ndarray,
    onnx_quantized: dict[str, QuantizedModel],
    tmp_path: Path,
) -> None:
    """calib=mse at 4-bit activations: ORT's and the PyTorch recipe's ranges agree tensor by tensor (the same
    histogram and grid) and clip most tensors well inside the minmax range."""
    pytest.importorskip("torchao")
    from resnet8ptq.backends.torch.backend import TorchBackend

    spec = QuantSpec(DtypeConfig("uint8", "int8", activation_bits=4), CalibConfig("mse", num_bins=2048), True)
    found = {}
    for backend in (onnx_backend(native=False), TorchBackend(native=False)):
        quantized = backend.quantize(
            canonical_model.onnx_path, calibration_images, spec, tmp_path / backend.NAME
        )
        found[backend.NAME] = {r.tensor: (r.min, r.max) for r in quantized.ranges}
    onnx_ranges, torch_ranges = found["onnx"], found["torch"]
    torch_ranges["input"] = torch_ranges.pop(
        "model_1/conv2d_1/BiasAdd__6:0"
    )  # after the NHWC->NCHW transpose
    assert len(torch_ranges) >= 10 and set(torch_ranges) <= set(onnx_ranges)
    for name, bounds in torch_ranges.items():  # at most one candidate step (1 % of the data's range) apart
        np.testing.assert_allclose(bounds, onnx_ranges[name], rtol=0.011, atol=1e-6, err_msg=name)
    minmax = {r.tensor: (r.min, r.max) for r in onnx_quantized["minmax"].ranges}
    clipped = [name for name in torch_ranges if onnx_ranges[name][1] < 0.9 * minmax[name][1]]
    assert len(clipped) >= len(torch_ranges) // 2, clipped


@pytest.mark.parametrize("bits", [4, 8])
def test_mse_weight_clipping_is_what_onnx_runtime_stores(
    onnx_backend, canonical_model: CanonicalModel, calibration_images: np.ndarray, tmp_path: Path, bits: int
) -> None:
    """``calib.weights=mse``: ORT stores each weight's integers on the clipped grid, saturated at the width's
    range (ORT itself saturates only at the int8 bounds), and the saved model reads back at that width."""
    import onnx
    from onnx import numpy_helper

    from resnet8ptq.weight_grid import channel_axis, quantized_weights, weight_grid

    spec = QuantSpec(
        DtypeConfig("uint8", "int8", weight_bits=bits), CalibConfig("minmax", weights="mse"), per_channel=True
    )
    quantized = onnx_backend(native=False).quantize(
        canonical_model.onnx_path, calibration_images, spec, tmp_path
    )
    assert quantized.weight_bits == bits
    stored = {
        init.name.removesuffix("_quantized"): numpy_helper.to_array(init)
        for init in onnx.load(quantized.path).graph.initializer
        if init.name.endswith("_quantized")
    }
    saturated = 0
    for name, (node, weight) in quantized_weights(onnx.load(canonical_model.onnx_path)).items():
        grid = weight_grid(weight, channel_axis(node), spec)
        np.testing.assert_array_equal(stored[name], grid.quantize(weight), err_msg=name)
        unclipped = np.clip(np.round(weight / _along(grid.scale, grid.axis, weight.ndim)), -128, 127)
        saturated += int(np.count_nonzero(np.abs(unclipped) > grid.qmax))
    assert saturated > 0  # the clipping is real: some weights lie beyond their grid's range


def _along(values: np.ndarray, axis: int, ndim: int) -> np.ndarray:
    """Per-channel ``values`` shaped to broadcast along ``axis`` of an ``ndim``-d array."""
    shape = [1] * ndim
    shape[axis] = -1
    return values.reshape(shape)
