"""ONNX Runtime's calibrators fed float64 activations (resnet8ptq/backends/onnx/float64.py), on a hand-made
conv graph: the same tensors and, to float32's rounding, the same ranges as ORT's own float32 session, with
the graph input passed through; each value a float64 sum rounded once to float32; the MinMax calibrator's
extrema taken in one pass equal onnx2torch's axis-by-axis ones; a calibrator without the session attribute
is refused by name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationMethod, create_calibrator

from resnet8ptq.backends.onnx import float64 as float64_module
from resnet8ptq.backends.onnx.backend import session
from resnet8ptq.backends.onnx.float64 import Float64Session, use_float64
from resnet8ptq.backends.onnx.reader import ImageReader


def conv_model(path: Path, weight: np.ndarray) -> Path:
    """input (N, C, 6, 6) -> Conv (3x3, ``weight``'s output channels, padded) -> Relu -> output."""
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["input", "w", "b"], ["conv"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["conv"], ["output"]),
        ],
        "g",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [None, weight.shape[1], 6, 6])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [None, weight.shape[0], 6, 6])],
        [
            numpy_helper.from_array(weight, "w"),
            numpy_helper.from_array(np.zeros(len(weight), np.float32), "b"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def ranges(path: Path, images: np.ndarray, method: CalibrationMethod, float64: bool) -> dict:
    calibrator = create_calibrator(
        path, ["Conv", "Relu"], augmented_model_path=str(path.with_name("aug.onnx")), calibrate_method=method
    )
    if float64:
        use_float64(calibrator, threads=1)
    calibrator.collect_data(ImageReader(images, 4, "input"))
    found = calibrator.compute_data().data
    return {
        name: tuple(float(np.asarray(v).item()) for v in data.range_value) for name, data in found.items()
    }


@pytest.mark.parametrize("method", [CalibrationMethod.MinMax, CalibrationMethod.Entropy])
def test_the_same_tensors_and_ranges_as_orts_session(tmp_path: Path, method: CalibrationMethod) -> None:
    rng = np.random.default_rng(0)
    path = conv_model(tmp_path / "m.onnx", rng.normal(size=(4, 2, 3, 3)).astype(np.float32))
    images = rng.uniform(-3, 3, size=(8, 2, 6, 6)).astype(np.float32)
    ort, ours = ranges(path, images, method, False), ranges(path, images, method, True)
    assert ours.keys() == ort.keys() and {"input", "conv"} <= ours.keys()
    assert ours["input"] == ort["input"]  # passed through, not computed
    for name, (low, high) in ort.items():
        assert ours[name] == pytest.approx((low, high), rel=1e-5, abs=1e-5), name


def test_values_are_float64_sums_rounded_once(tmp_path: Path) -> None:
    """576-term dot products: the outputs equal NumPy's float64 convolution rounded to float32, where ORT's
    float32 session misses some of them in the last bit (so the comparison can tell the two apart)."""
    rng = np.random.default_rng(1)
    weight = rng.normal(size=(8, 64, 3, 3)).astype(np.float32)
    images = rng.normal(size=(4, 64, 6, 6)).astype(np.float32)
    path = conv_model(tmp_path / "m.onnx", weight)
    padded = np.pad(images.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))  # N C H W 3 3
    exact = np.maximum(np.einsum("nchwij,ocij->nohw", windows, weight.astype(np.float64)), 0).astype(
        np.float32
    )
    float64 = Float64Session(path, threads=1)
    (ours,) = float64.run(None, {"input": images})
    (ort_float32,) = session(path, threads=1).run(None, {"input": images})
    assert [o.name for o in float64.get_outputs()] == ["output"]
    assert ours.dtype == np.float32
    np.testing.assert_array_equal(ours, exact)
    assert (ort_float32 != exact).any()


@pytest.mark.parametrize("per_channel", [False, True])
def test_extrema_in_one_pass_equal_onnx2torchs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, per_channel: bool
) -> None:
    """ORT's MinMax calibrator reduces each tensor over all axes (per channel: all but the channel's), keeping
    the dimensions: torch.amax/amin in place of onnx2torch's modules give the same ranges exactly."""
    from onnx2torch.node_converters.reduce import OnnxReduceStaticAxes

    rng = np.random.default_rng(2)
    path = conv_model(tmp_path / "m.onnx", rng.normal(size=(4, 2, 3, 3)).astype(np.float32))
    images = rng.uniform(-3, 3, size=(8, 2, 6, 6)).astype(np.float32)

    def collected() -> tuple[dict[str, tuple[np.ndarray, ...]], list[str]]:
        calibrator = create_calibrator(
            path,
            ["Conv", "Relu"],
            augmented_model_path=str(tmp_path / "aug.onnx"),
            calibrate_method=CalibrationMethod.MinMax,
            extra_options={"per_channel": per_channel},
        )
        use_float64(calibrator, threads=1)
        modules = [type(module).__name__ for module in calibrator.infer_session._module.modules()]
        calibrator.collect_data(ImageReader(images, 4, "input"))
        found = calibrator.compute_data().data
        return {name: tuple(map(np.asarray, data.range_value)) for name, data in found.items()}, modules

    ours, modules = collected()
    monkeypatch.setattr(float64_module, "one_pass_extrema", lambda module: module)
    theirs, their_modules = collected()
    assert OnnxReduceStaticAxes.__name__ in their_modules and OnnxReduceStaticAxes.__name__ not in modules
    assert ours.keys() == theirs.keys() and "conv" in ours
    assert ours["conv"][0].size == (4 if per_channel else 1)  # one range per output channel, or one
    for name, (low, high) in theirs.items():
        np.testing.assert_array_equal(ours[name][0], low, err_msg=name)
        np.testing.assert_array_equal(ours[name][1], high, err_msg=name)


def test_a_calibrator_without_a_session_is_refused() -> None:
    with pytest.raises(RuntimeError, match="has no infer_session/augmented_model_path"):
        use_float64(object(), threads=1)
