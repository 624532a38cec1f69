"""The vectorised KL-divergence threshold search (resnet8ptq/entropy_threshold.py) finds exactly ORT's
thresholds: on histograms ORT's collector makes from skewed, spiky, sparse and small data (window sizes that
do and do not divide into the quantized bins), on a histogram that is zero outside its centre, and it leaves
a float histogram to ORT; ORT's histogram calibrators get the collector with their own settings, others do
not."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnxruntime.quantization import CalibrationMethod, calibrate, create_calibrator

from resnet8ptq.entropy_threshold import HistogramCollector, use_fast_search
from tests.unit.test_onnx_float64 import conv_model


def collected(data: list[np.ndarray], num_bins: int, num_quantized_bins: int) -> tuple:
    """The histogram ORT's own collector builds from these batches (merged as they come)."""
    collector = calibrate.HistogramCollector("entropy", False, num_bins, num_quantized_bins, 0, "same")
    collector.collect({"t": data})
    return collector.histogram_dict["t"]


def datasets() -> dict[str, list[np.ndarray]]:
    rng = np.random.default_rng(3)
    return {
        "relu, growing range": [np.maximum(rng.normal(0, s, 4000), 0).astype(np.float32) for s in (1, 2, 5)],
        "heavy tails": [rng.standard_t(2, 6000).astype(np.float32)],
        "spikes": [np.repeat(np.float32([-1, 0, 0.25, 3]), [50, 3000, 700, 2])],
        "sparse": [rng.normal(0, 1, 40).astype(np.float32)],
        # few counts per bin: fractional spreads, where truncating and rounding them choose differently
        "few samples": [np.random.default_rng(6).laplace(0, 1, 300).astype(np.float32)],
    }


@pytest.mark.parametrize("name", list(datasets()))
@pytest.mark.parametrize(("num_bins", "num_quantized_bins"), [(512, 64), (301, 37)])
def test_the_same_threshold_as_orts_search(name: str, num_bins: int, num_quantized_bins: int) -> None:
    histogram = collected(datasets()[name], num_bins, num_quantized_bins)
    assert histogram[0].dtype == np.int64
    ours = HistogramCollector("entropy", False, num_bins, num_quantized_bins, 0, "same")
    orts = calibrate.HistogramCollector("entropy", False, num_bins, num_quantized_bins, 0, "same")
    expected = orts.get_entropy_threshold(histogram, num_quantized_bins)
    found = ours.get_entropy_threshold(histogram, num_quantized_bins)
    assert [np.asarray(v).item() for v in found] == [np.asarray(v).item() for v in expected]
    assert [np.asarray(v).dtype for v in found] == [np.asarray(v).dtype for v in expected]


def test_a_histogram_empty_outside_its_centre() -> None:
    hist = np.zeros(256, np.int64)
    hist[120:136] = np.arange(1, 17)
    histogram = (hist, np.linspace(-1, 1, 257, dtype=np.float32), np.float32(-0.06), np.float32(0.06), 1)
    ours = HistogramCollector("entropy", False, 256, 32, 0, "same").get_entropy_threshold(histogram, 32)
    orts = calibrate.HistogramCollector("entropy", False, 256, 32, 0, "same").get_entropy_threshold(
        histogram, 32
    )
    assert [float(v) for v in ours] == [float(v) for v in orts]


def test_a_float_histogram_is_left_to_orts_search(monkeypatch: pytest.MonkeyPatch) -> None:
    called = []
    monkeypatch.setattr(
        calibrate.HistogramCollector, "get_entropy_threshold", lambda self, h, n: called.append(n) or (0, 1)
    )
    histogram = (np.ones(64), np.linspace(-1, 1, 65), -1.0, 1.0, 1.0)
    assert HistogramCollector("entropy", False, 64, 8, 0, "same").get_entropy_threshold(histogram, 8) == (
        0,
        1,
    )
    assert called == [8]


@pytest.mark.parametrize(
    ("method", "options", "given"),
    [
        (CalibrationMethod.Entropy, {"num_bins": 300, "num_quantized_bins": 30}, True),
        (CalibrationMethod.Percentile, {"num_bins": 300, "percentile": 99.5, "symmetric": True}, True),
        (CalibrationMethod.MinMax, {}, False),
    ],
)
def test_histogram_calibrators_get_the_collector_with_their_settings(
    tmp_path: Path, method: CalibrationMethod, options: dict, given: bool
) -> None:
    path = conv_model(tmp_path / "m.onnx", np.ones((2, 1, 3, 3), np.float32))
    calibrator = create_calibrator(
        path, ["Conv"], str(tmp_path / "aug.onnx"), calibrate_method=method, extra_options=options
    )
    use_fast_search(calibrator)
    collector = getattr(calibrator, "collector", None)
    assert isinstance(collector, HistogramCollector) == given
    if given:
        assert collector.num_bins == 300 and collector.method == calibrator.method
        assert (collector.percentile, collector.symmetric) == (calibrator.percentile, calibrator.symmetric)
        assert collector.num_quantized_bins == calibrator.num_quantized_bins
