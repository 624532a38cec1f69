"""Per-layer SQNR of the ONNX Runtime backend on the real model: the streamed measurement equals ORT's
``qdq_loss_debug`` run the way its docs show (every tensor of every batch collected, matched, compared)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnxruntime.quantization.qdq_loss_debug import (
    collect_activations,
    compute_activation_error,
    create_activation_matching,
    modify_model_output_intermediate_tensors,
)

from resnet8ptq.backends.onnx.layer_errors import STREAM_BATCH, QdqPairs
from resnet8ptq.backends.onnx.reader import ImageReader, input_name
from resnet8ptq.calibration import CalibConfig
from resnet8ptq.data import Cifar10, calibration_set
from resnet8ptq.dtype import DtypeConfig
from resnet8ptq.layer_errors import measure
from resnet8ptq.model import CanonicalModel, layer_name
from resnet8ptq.spec import QuantSpec

SPECS = {
    "uint8/int8 per-tensor": QuantSpec(DtypeConfig("uint8", "int8"), CalibConfig("minmax"), False),
    "int8/int8 per-channel": QuantSpec(DtypeConfig("int8", "int8"), CalibConfig("minmax"), True),
}


@pytest.fixture(scope="module")
def calib_images(cifar: Cifar10) -> np.ndarray:
    return calibration_set(cifar, per_class=10, seed=42)[0]


def ort_as_documented(
    float_path: Path, qdq_path: Path, images: np.ndarray, workdir: Path
) -> dict[str, float]:
    """Activation SQNR (dB) by layer from ORT's qdq_loss_debug, all tensors of all batches held at once."""
    collected = {}
    for name, path in (("float", float_path), ("qdq", qdq_path)):
        augmented = workdir / f"{name}.onnx"
        modify_model_output_intermediate_tensors(str(path), str(augmented))
        collected[name] = collect_activations(str(augmented), ImageReader(images, 40, input_name(path)))
    matched = create_activation_matching(collected["qdq"], collected["float"])
    return {
        layer_name(tensor): result["xmodel_err"]
        for tensor, result in compute_activation_error(matched).items()
        if "xmodel_err" in result
    }


@pytest.mark.parametrize("name", SPECS)
def test_streamed_sqnr_equals_ort_qdq_loss_debug(
    onnx_backend, name, canonical_model: CanonicalModel, calib_images, tmp_path
):
    """90 images: the tool streams 25 at a time (the last batch short), ORT's way takes batches of 40;
    the same layers with the same SQNR, bar the model input and its NHWC -> NCHW Transpose (integer pixels,
    quantized losslessly, left out by the tool)."""
    images = calib_images[:90]
    backend = onnx_backend(native=False)
    quantized = backend.quantize(canonical_model.onnx_path, calib_images, SPECS[name], tmp_path)
    streamed = {
        e.layer: e.sqnr_db
        for e in measure(QdqPairs(canonical_model.onnx_path, quantized.path), images)
        if e.kind == "activation"
    }
    expected = ort_as_documented(canonical_model.onnx_path, quantized.path, images, tmp_path)
    assert len(images) % STREAM_BATCH != 0
    assert len(streamed) >= 11
    assert streamed.keys() == expected.keys() - {"input", "conv2d_1/BiasAdd__6"}
    for layer, sqnr in streamed.items():
        assert sqnr == pytest.approx(expected[layer], abs=1e-3), layer


def test_nothing_is_written_beside_the_models(
    onnx_backend, canonical_model: CanonicalModel, calib_images, tmp_path, monkeypatch
):
    """Parallel runs share the cached FP32 model: ORT's augmentation writes (and deletes)
    `<model>-inferred.onnx` beside the model it reads, so the tool must hand it copies in a folder of its own
    (two joblib jobs failed with FileNotFoundError on each other's deleted file)."""
    quantized = onnx_backend(native=False).quantize(
        canonical_model.onnx_path, calib_images, SPECS["uint8/int8 per-tensor"], tmp_path / "run"
    )
    written: list[Path] = []
    infer_shapes_path = onnx.shape_inference.infer_shapes_path

    def recording(model_path: str, output_path: str = "", *args, **kwargs):
        written.append(Path(output_path or model_path))
        return infer_shapes_path(model_path, output_path, *args, **kwargs)

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes_path", recording)
    measure(QdqPairs(canonical_model.onnx_path, quantized.path), calib_images[:25])
    assert len(written) == 2, "ORT's shape inference was not seen: the check below would prove nothing"
    shared = {canonical_model.onnx_path.parent, quantized.path.parent}
    assert not [path for path in written if path.parent in shared]
