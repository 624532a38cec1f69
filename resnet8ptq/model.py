"""The FP32 model: fetch the Keras .h5, convert it once to the canonical pre-processed ONNX (cached)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from resnet8ptq.errors import ModelError
from resnet8ptq.fetch import ASSETS_ENV, FetchError, published_file, sha256_of

log = logging.getLogger(__name__)

PACKAGE_ROOT = Path(__file__).resolve().parents[1]

MODEL_URL = (
    "https://github.com/mlcommons/tiny/raw/master/benchmark/training/image_classification/"
    "trained_models/pretrainedResnet.h5"
)
MODEL_FILENAME = "pretrainedResnet.h5"
MODEL_SHA256 = "5f938a8eea605438cc7360aa13c987bc6d7bd0c8d931b2917361ae7ae4eeda2f"
INPUT_NAME = "input"
ONNX_OPSET = 17
# onnxruntime 1.31 refuses models whose IR version is newer than it knows; onnx >= 1.23 writes newer ones.
MAX_IR_VERSION = 10
# Bump when the conversion recipe changes, so that old cache entries are not reused.
# 3: names independent of tf2onnx's counter; 4: BatchNorm scales in float64, initializers in name order
RECIPE_VERSION = 4


@dataclass(frozen=True)
class CanonicalModel:
    """The pre-processed FP32 ONNX model that every backend starts from."""

    onnx_path: Path
    h5_path: Path
    h5_sha256: str
    converted_now: bool


def resolve_h5(path: str | Path | None, sha256: str | None, cache_dir: Path) -> tuple[Path, str]:
    """Locate the Keras model and check its sha256; download MLPerf Tiny's model when none is given.

    Order: an explicit ``path``; ``$RESNET8PTQ_ASSETS/models/pretrainedResnet.h5``; the cache (downloading
    it there when absent). Returns the path and its actual sha256.
    """
    if path is not None:
        h5 = Path(path).expanduser().resolve()
        if not h5.is_file():
            raise ModelError(f"model.path={h5} does not exist. Point model.path at a Keras .h5 file.")
    else:
        try:
            h5 = published_file(MODEL_FILENAME, MODEL_URL, MODEL_SHA256, cache_dir, "MLPerf Tiny ResNet8")
        except FetchError as err:
            raise ModelError(
                f"{err}\nNo local model found: set model.path to a Keras .h5 file, or set "
                f"{ASSETS_ENV} to a directory holding models/{MODEL_FILENAME}."
            ) from err
    actual = sha256_of(h5)
    if sha256 is not None and actual != sha256:
        raise ModelError(
            f"{h5}: sha256 {actual} does not match the expected {sha256}. The file is corrupt or a "
            f"different model; replace it, or set model.sha256=null to accept a custom model."
        )
    _check_hdf5(h5)
    return h5, actual


def _check_hdf5(h5: Path) -> None:
    with h5.open("rb") as f:
        signature = f.read(8)
    if signature != b"\x89HDF\r\n\x1a\n":
        raise ModelError(f"{h5} is not an HDF5 file (bad signature {signature!r}); give a Keras .h5 model.")


def converter_versions() -> dict[str, str]:
    """Versions of the libraries that shape the converted model (read without importing them)."""
    versions = {}
    for name, dists in {
        "tensorflow": ("tensorflow-cpu", "tensorflow"),
        "tf2onnx": ("tf2onnx",),
        "onnx": ("onnx",),
        "onnxruntime": ("onnxruntime",),
    }.items():
        for dist in dists:
            try:
                versions[name] = importlib.metadata.version(dist)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
        else:
            versions[name] = "absent"
    return versions


def conversion_key(h5_sha256: str) -> str:
    """What decides the canonical ONNX: the h5's sha256, the converter versions and the recipe version."""
    key_src = json.dumps({"h5": h5_sha256, **converter_versions(), "recipe": RECIPE_VERSION}, sort_keys=True)
    return hashlib.sha256(key_src.encode()).hexdigest()[:16]


def canonical_onnx(h5: Path, h5_sha256: str, cache_dir: Path) -> CanonicalModel:
    """Return the cached canonical ONNX for ``h5``, converting it first if needed.

    Cache key: ``conversion_key``. The file is written to a temporary name and renamed, so an interrupted
    conversion never leaves a corrupt cache entry.
    """
    target = cache_dir / "onnx" / f"resnet8-{conversion_key(h5_sha256)}.onnx"
    if target.is_file():
        return CanonicalModel(target, h5, h5_sha256, converted_now=False)
    target.parent.mkdir(parents=True, exist_ok=True)
    log.info("Converting %s to ONNX (cached as %s)", h5, target)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".convert-") as tmp:
        raw = Path(tmp) / "raw.onnx"
        pre = Path(tmp) / "pre.onnx"
        _keras_to_onnx(h5, raw)
        _pre_process(raw, pre)
        os.replace(pre, target)
    return CanonicalModel(target, h5, h5_sha256, converted_now=True)


def check_input(canonical: CanonicalModel, images_shape: tuple[int, ...]) -> None:
    """Refuse, naming both shapes, a model whose input does not take the data's images (``images_shape``:
    theirs, N first), before a backend runs it."""
    import onnx

    graph_input = onnx.load(canonical.onnx_path, load_external_data=False).graph.input[0]
    dims = [d.dim_value if d.HasField("dim_value") else None for d in graph_input.type.tensor_type.shape.dim]
    expected = tuple(images_shape[1:])
    fits = len(dims) == len(expected) + 1 and all(
        d in (None, e) for d, e in zip(dims[1:], expected, strict=True)
    )
    if not fits:
        shape = ", ".join(["N", *("?" if d is None else str(d) for d in dims[1:])])
        raise ModelError(
            f"{canonical.h5_path}: the model takes inputs of shape ({shape}), the data's images are "
            f"(N, {', '.join(map(str, expected))}) (CIFAR-10, NHWC, raw 0-255 pixels); the tool evaluates "
            "on CIFAR-10 only so far, so a model for other data cannot run."
        )


def _keras_to_onnx(h5: Path, out: Path) -> None:
    """tf2onnx conversion in a child process (:func:`tensorflow_child`)."""
    failure = tensorflow_child("resnet8ptq.model", str(h5), str(out))
    if failure is not None or not out.is_file():
        raise ModelError(f"Converting {h5} to ONNX failed: {failure or 'no output'}")


def tensorflow_child(module: str, *args: str) -> str | None:
    """Run ``python -m <module> ARGS`` in a child process, for work that imports TensorFlow: TensorFlow never
    shares a process with the runner (in one process with PyTorch it crashed the PyTorch backend), and it
    stays out of every run's imports. Returns None on success, else the child's last stderr line."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")])),
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    result = subprocess.run(
        [sys.executable, "-m", module, *args], env=env, capture_output=True, text=True, check=False
    )
    if result.returncode == 0:
        return None
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else f"exit status {result.returncode}, no output"


def keras_to_onnx_in_this_process(h5: Path, out: Path) -> None:
    """tf2onnx conversion (imports TensorFlow), BatchNormalization scales computed in float64
    (:mod:`resnet8ptq.batchnorm_fold`)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import onnx
    import tensorflow as tf
    import tf2onnx

    from resnet8ptq.batchnorm_fold import float64_batchnorm

    try:
        keras_model = tf.keras.models.load_model(h5, compile=False)
    except Exception as err:  # Keras raises many types for unreadable files
        raise ModelError(f"Keras could not load {h5}: {err}") from err
    spec = (tf.TensorSpec((None, *keras_model.input_shape[1:]), tf.float32, name=INPUT_NAME),)
    with float64_batchnorm(tf):
        model_proto, _ = tf2onnx.convert.from_keras(keras_model, input_signature=spec, opset=ONNX_OPSET)
    onnx.save(model_proto, out)


def _pre_process(raw: Path, out: Path) -> None:
    """ORT's quantization pre-processing: shape inference and graph optimisation (folds the BatchNorms)."""
    import onnx
    from onnxruntime.quantization.shape_inference import quant_pre_process

    static = raw.with_name("static.onnx")
    save_onnx(static_reshapes(onnx.load(raw)), static)
    quant_pre_process(static, out)
    save_onnx(sorted_initializers(numbered_dims(onnx.load(out))), out)


UNKNOWN_DIM = re.compile(r"unk__\d+")
"""tf2onnx's name for a dimension it does not know (the batch), numbered by its process-wide counter."""


def numbered_dims(model):
    """Rename tf2onnx's unknown dimensions (``unk__148`` in one conversion, ``unk__149`` in another) to
    ``unk_0``, ``unk_1``, ... in the order they first appear (inputs, outputs, value_info): the same names
    on every conversion."""
    graph = model.graph
    names: dict[str, str] = {}
    for info in [*graph.input, *graph.output, *graph.value_info]:
        for dim in info.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and UNKNOWN_DIM.fullmatch(dim.dim_param):
                dim.dim_param = names.setdefault(dim.dim_param, f"unk_{len(names)}")
    return model


def sorted_initializers(model):
    """The graph's initializers in name order: ONNX Runtime's optimiser writes them in its hash table's order,
    which is not the same from one conversion to the next (three conversions of the same .h5 on an Intel
    Xeon gave three orders, so three FP32 model digests: issue 72)."""
    ordered = sorted(model.graph.initializer, key=lambda tensor: tensor.name)
    del model.graph.initializer[:]
    model.graph.initializer.extend(ordered)
    return model


def static_reshapes(model):
    """Give every Reshape whose output shape inference proves static (but its batch) the constant target
    [-1, ...] named ``<output>/static_shape``, and drop the nodes and constants that gave its target before:
    tf2onnx's flatten is either Shape -> Gather -> Concat, computed at run time, or a constant that
    TensorFlow's graph optimiser folded, named by tf2onnx's process-wide counter (``Reshape_shape__147`` in
    one conversion, ``__148`` in another). The canonical model is then the same bytes on every conversion,
    and torch.export sees a static reshape."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True).graph
    shapes = {info.name: info.type.tensor_type.shape.dim for info in [*inferred.value_info, *inferred.output]}
    for node in model.graph.node:
        dims = shapes.get(node.output[0], [])
        name = f"{node.output[0]}/static_shape"
        if node.op_type != "Reshape" or node.input[1] == name or len(dims) < 2:
            continue
        if all(dim.HasField("dim_value") for dim in dims[1:]):
            target = np.array([-1, *(dim.dim_value for dim in dims[1:])], dtype=np.int64)
            model.graph.initializer.append(numpy_helper.from_array(target, name))
            node.input[1] = name
    return _without_dead_nodes(model)


def _without_dead_nodes(model):
    """Remove nodes none of whose outputs are used (repeatedly), and initializers nothing reads."""
    graph = model.graph
    while True:
        used = {name for node in graph.node for name in node.input} | {out.name for out in graph.output}
        dead = [node for node in graph.node if not any(name in used for name in node.output)]
        if not dead:
            break
        for node in dead:
            graph.node.remove(node)
    for init in [init for init in graph.initializer if init.name not in used]:
        graph.initializer.remove(init)
    return model


def layer_name(tensor: str) -> str:
    """A readable layer name from a tf2onnx tensor name (model_1/conv2d_5_1/BiasAdd:0 -> conv2d_5_1/BiasAdd,
    ConvMulFusion_W_model_1/conv2d_1/convolution/ReadVariableOp:0 -> conv2d_1)."""
    name = tensor.removeprefix("ConvMulFusion_W_").removeprefix("model_1/").removesuffix(":0")
    return name.removesuffix("/ReadVariableOp").removesuffix("/convolution")


def save_onnx(model, path: Path) -> None:
    """Save an ONNX ModelProto with an IR version onnxruntime accepts."""
    import onnx

    model.ir_version = min(model.ir_version, MAX_IR_VERSION)
    onnx.save(model, path)


if __name__ == "__main__":  # the conversion child process: python -m resnet8ptq.model H5 OUT
    try:
        keras_to_onnx_in_this_process(Path(sys.argv[1]), Path(sys.argv[2]))
    except ModelError as error:
        sys.exit(f"ModelError: {error}")
