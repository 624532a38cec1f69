"""The canonical FP32 model: conversion, cache, accuracy, and refusal of bad model files."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from resnet8ptq import model as model_module
from resnet8ptq.backends.onnx.backend import predictor, session
from resnet8ptq.data import Cifar10, to_model_input
from resnet8ptq.errors import ModelError
from resnet8ptq.evaluate import TestSet, evaluate
from resnet8ptq.model import MODEL_SHA256, CanonicalModel, canonical_onnx, resolve_source


def test_fp32_accuracy_is_exactly_the_reference(canonical_model: CanonicalModel, cifar: Cifar10) -> None:
    result = evaluate(
        predictor(session(canonical_model.onnx_path)),
        TestSet(to_model_input(cifar.test_images), cifar.test_labels),
    )
    assert result.correct == 8719


def test_conversion_is_cached(canonical_model: CanonicalModel, model_cache: Path) -> None:
    again = canonical_onnx(canonical_model.source_path, canonical_model.source_sha256, model_cache)
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
        canonical_onnx(canonical_model.source_path, canonical_model.source_sha256, tmp_path)
    assert list((tmp_path / "onnx").iterdir()) == []


def test_wrong_sha256_is_refused(canonical_model: CanonicalModel, tmp_path: Path) -> None:
    tampered = tmp_path / "model.h5"
    data = bytearray(canonical_model.source_path.read_bytes())
    data[-1] ^= 0xFF
    tampered.write_bytes(bytes(data))
    with pytest.raises(ModelError, match="does not match the expected"):
        resolve_source(tampered, MODEL_SHA256, tmp_path)


def test_download_when_no_local_copy(
    canonical_model: CanonicalModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served = tmp_path / "served.h5"
    shutil.copy(canonical_model.source_path, served)
    monkeypatch.delenv(model_module.ASSETS_ENV, raising=False)
    h5, sha256 = resolve_source(None, MODEL_SHA256, tmp_path / "cache", url=served.as_uri())
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


def test_a_second_conversion_in_another_process_is_the_same_bytes(
    canonical_model: CanonicalModel, tmp_path: Path
) -> None:
    """Issue 72: a conversion in a fresh cache, in a process of its own, gives the same file, so every run's
    FP32 `digest.model` is the same; and that is the FP32 model pinned for every CPU kind."""
    from resnet8ptq.digests import model_digest
    from resnet8ptq.hardware import detect
    from tests.integration import pinned

    script = (
        "import sys; from pathlib import Path; from resnet8ptq.model import canonical_onnx; "
        "print(canonical_onnx(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])).onnx_path)"
    )
    args = [str(canonical_model.source_path), canonical_model.source_sha256, str(tmp_path / "fresh-cache")]
    done = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    again = Path(done.stdout.strip().splitlines()[-1])
    assert again.parent.parent == tmp_path / "fresh-cache"
    assert again.read_bytes() == canonical_model.onnx_path.read_bytes()
    pinned.check("fp32", {"digest.model": model_digest(canonical_model.onnx_path)}, detect())


def test_batchnorm_scales_are_folded_from_float64(tmp_path: Path) -> None:
    """Issue 72: the folded BatchNorm scale is `float32(gamma / sqrt(float32(variance + eps)))` with float64
    square root and division (IEEE operations, alike on every CPU), where TensorFlow's own Rsqrt kernel is
    inexact and follows the CPU (the child saves what TensorFlow folds: it differs in some channels)."""
    import onnx
    from onnx import numpy_helper

    from resnet8ptq.batchnorm_fold import batchnorm_scale
    from resnet8ptq.model import sha256_of

    child = Path(__file__).with_name("batchnorm_child.py")
    done = subprocess.run(
        [sys.executable, str(child), str(tmp_path / "bn")],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    h5, made = tmp_path / "bn.h5", np.load(tmp_path / "bn.npz")
    scale = batchnorm_scale(made["gamma"], made["variance"], 1e-3)
    assert np.count_nonzero(made["tf_scale"] != scale) > 0, "TensorFlow's Rsqrt was exact: nothing is tested"

    converted = onnx.load(canonical_onnx(h5, sha256_of(h5), tmp_path / "cache").onnx_path)
    (conv,) = [node for node in converted.graph.node if node.op_type == "Conv"]
    assert [node.op_type for node in converted.graph.node if node.op_type in ("Mul", "Add")] == []
    constants = {init.name: numpy_helper.to_array(init) for init in converted.graph.initializer}
    weight, bias = constants[conv.input[1]], constants[conv.input[2]]
    offset = made["beta"] - made["mean"] * scale  # float32, as TensorFlow computes it
    np.testing.assert_array_equal(weight, made["kernel"] * scale[:, None, None, None])
    np.testing.assert_array_equal(bias, made["bias"] * scale + offset)
