"""The canonical FP32 model: conversion, cache, accuracy, and refusal of bad model files."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from resnet8ptq import model as model_module
from resnet8ptq.backends.onnx.backend import predictor, session
from resnet8ptq.data import Cifar10, to_model_input
from resnet8ptq.errors import ModelError
from resnet8ptq.evaluate import evaluate
from resnet8ptq.model import MODEL_SHA256, CanonicalModel, canonical_onnx, resolve_h5


def test_fp32_accuracy_is_exactly_the_reference(canonical_model: CanonicalModel, cifar: Cifar10) -> None:
    result = evaluate(
        predictor(session(canonical_model.onnx_path)), to_model_input(cifar.test_images), cifar.test_labels
    )
    assert result.correct == 8719


def test_conversion_is_cached(canonical_model: CanonicalModel, model_cache: Path) -> None:
    again = canonical_onnx(canonical_model.h5_path, canonical_model.h5_sha256, model_cache)
    assert again.onnx_path == canonical_model.onnx_path
    assert again.converted_now is False


def test_batchnorms_are_folded(canonical_model: CanonicalModel) -> None:
    import onnx

    ops = [node.op_type for node in onnx.load(canonical_model.onnx_path).graph.node]
    assert ops.count("Conv") == 9
    assert "Mul" not in ops and "BatchNormalization" not in ops


def test_interrupted_conversion_leaves_no_cache_entry(
    canonical_model: CanonicalModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def killed(raw: Path, out: Path) -> None:
        out.write_bytes(b"half a model")
        raise KeyboardInterrupt

    monkeypatch.setattr(model_module, "_pre_process", killed)
    with pytest.raises(KeyboardInterrupt):
        canonical_onnx(canonical_model.h5_path, canonical_model.h5_sha256, tmp_path)
    assert list((tmp_path / "onnx").iterdir()) == []


def test_wrong_sha256_is_refused(canonical_model: CanonicalModel, tmp_path: Path) -> None:
    tampered = tmp_path / "model.h5"
    data = bytearray(canonical_model.h5_path.read_bytes())
    data[-1] ^= 0xFF
    tampered.write_bytes(bytes(data))
    with pytest.raises(ModelError, match="does not match the expected"):
        resolve_h5(tampered, MODEL_SHA256, tmp_path)


def test_download_when_no_local_copy(
    canonical_model: CanonicalModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served = tmp_path / "served.h5"
    shutil.copy(canonical_model.h5_path, served)
    monkeypatch.delenv(model_module.ASSETS_ENV, raising=False)
    monkeypatch.setattr(model_module, "MODEL_URL", served.as_uri())
    h5, sha256 = resolve_h5(None, MODEL_SHA256, tmp_path / "cache")
    assert h5 == tmp_path / "cache" / "models" / model_module.MODEL_FILENAME
    assert sha256 == MODEL_SHA256


def test_predictions_are_probabilities(canonical_model: CanonicalModel, cifar: Cifar10) -> None:
    probs = predictor(session(canonical_model.onnx_path))(to_model_input(cifar.test_images[:8]))
    assert probs.shape == (8, 10)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-5)


def test_flatten_is_a_static_reshape(canonical_model: CanonicalModel) -> None:
    import onnx

    graph = onnx.load(canonical_model.onnx_path).graph
    constants = {init.name for init in graph.initializer}
    reshapes = [node for node in graph.node if node.op_type == "Reshape"]
    assert reshapes and all(node.input[1] in constants for node in reshapes)
    assert not [node for node in graph.node if node.op_type in ("Shape", "Gather", "Concat")]
