"""The FP32 model: find or fetch the network's file (Keras, float .tflite or ONNX), convert it once to the
canonical pre-processed ONNX (cached)."""

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
from resnet8ptq.model_formats import load_keras, model_format

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
# 3: names independent of tf2onnx's counter; 4: BatchNorm scales in float64, initializers in name order;
# 5: static Squeeze/Unsqueeze as Reshape; 6: BatchNorms after dense layers folded (ResNet8: the same bytes
# as at 4)
RECIPE_VERSION = 6


@dataclass(frozen=True)
class CanonicalModel:
    """The pre-processed FP32 ONNX model that every backend starts from, and the file it was made from."""

    onnx_path: Path
    source_path: Path
    source_sha256: str
    converted_now: bool


def resolve_source(
    path: str | Path | None,
    sha256: str | None,
    cache_dir: Path,
    asset: str | None = MODEL_FILENAME,
    url: str | None = MODEL_URL,
) -> tuple[Path, str]:
    """Locate the model file and check its sha256 and format; download the published one when none is given.

    Order: an explicit ``path``; ``$RESNET8PTQ_ASSETS/models/<asset>``; the cache (downloading ``url`` there
    when absent; MLPerf Tiny's ResNet8 by default). Returns the path and its actual sha256.
    """
    if path is not None:
        source = Path(path).expanduser().resolve()
        if not source.exists():
            raise ModelError(
                f"model.path={source} does not exist. Point model.path at a Keras .h5/.keras file, a float "
                ".tflite or an .onnx file."
            )
    elif asset is None or url is None or sha256 is None:
        raise ModelError(
            "model.path is null and the model has no published file (model.asset, model.url, "
            "model.sha256): set model.path to the model's file."
        )
    else:
        try:
            source = published_file(asset, url, sha256, cache_dir, f"model {Path(asset).name}")
        except FetchError as err:
            raise ModelError(
                f"{err}\nNo local model found: set model.path to the model's file, or set "
                f"{ASSETS_ENV} to a directory holding models/{asset}."
            ) from err
    model_format(source)  # a directory, an unknown suffix or a mismatched file fails here
    actual = sha256_of(source)
    if sha256 is not None and actual != sha256:
        raise ModelError(
            f"{source}: sha256 {actual} does not match the expected {sha256}. The file is corrupt or a "
            f"different model; replace it, or set model.sha256=null to accept a custom model."
        )
    return source, actual


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


def conversion_key(sha256: str) -> str:
    """What decides the canonical ONNX: the model file's sha256, the converter versions and the recipe
    version."""
    key_src = json.dumps({"h5": sha256, **converter_versions(), "recipe": RECIPE_VERSION}, sort_keys=True)
    return hashlib.sha256(key_src.encode()).hexdigest()[:16]


def canonical_onnx(source: Path, sha256: str, cache_dir: Path, name: str = "resnet8") -> CanonicalModel:
    """Return the cached canonical ONNX for the model file ``source`` (network ``name``), converting it first
    if needed: a Keras model or a float .tflite by tf2onnx in a TensorFlow child, an ONNX model as it is;
    then ORT's pre-processing.

    Cache key: ``conversion_key``. The file is written to a temporary name and renamed, so an interrupted
    conversion never leaves a corrupt cache entry.
    """
    target = cache_dir / "onnx" / f"{name}-{conversion_key(sha256)}.onnx"
    if target.is_file():
        return CanonicalModel(target, source, sha256, converted_now=False)
    target.parent.mkdir(parents=True, exist_ok=True)
    log.info("Converting %s to ONNX (cached as %s)", source, target)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".convert-") as tmp:
        raw = Path(tmp) / "raw.onnx"
        pre = Path(tmp) / "pre.onnx"
        if model_format(source) == "onnx":
            _read_onnx(source, raw)
        else:
            _to_onnx(source, raw)
        _pre_process(raw, pre)
        os.replace(pre, target)
    return CanonicalModel(target, source, sha256, converted_now=True)


def model_io(canonical: CanonicalModel) -> tuple[tuple[int | None, ...], tuple[int, ...]]:
    """The canonical model's per-sample input shape (None where free) and output shape (classes: (K,))."""
    import onnx

    graph = onnx.load(canonical.onnx_path, load_external_data=False).graph

    def dims(info) -> list[int | None]:
        return [d.dim_value if d.HasField("dim_value") else None for d in info.type.tensor_type.shape.dim]

    outputs = dims(graph.output[0])
    if len(outputs) < 2 or None in outputs[1:]:
        raise ModelError(
            f"{canonical.source_path}: the model's output has shape {outputs} (None: free); the tool takes "
            "models with one output of a fixed shape per sample (N, classes) or (N, ...)."
        )
    return tuple(dims(graph.input[0])[1:]), tuple(outputs[1:])


def _read_onnx(source: Path, out: Path) -> None:
    """An ONNX model as the canonical model's start: checked, its one input named ``input``."""
    import onnx

    try:
        model = onnx.load(source)
        onnx.checker.check_model(model)
    except Exception as err:  # onnx raises its own and protobuf's errors for a bad file
        raise ModelError(f"{source} is not a valid ONNX model: {err}") from err
    if len(model.graph.input) != 1 or len(model.graph.output) != 1:
        raise ModelError(
            f"{source}: the model has {len(model.graph.input)} inputs and {len(model.graph.output)} outputs; "
            "the tool takes models of one input and one output."
        )
    save_onnx(named_input(model), out)


def _to_onnx(source: Path, out: Path) -> None:
    """tf2onnx conversion in a child process (:func:`tensorflow_child`)."""
    failure = tensorflow_child("resnet8ptq.model", str(source), str(out))
    if failure is not None or not out.is_file():
        raise ModelError(f"Converting {source} to ONNX failed: {failure or 'no output'}")


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


def to_onnx_in_this_process(source: Path, out: Path) -> None:
    """tf2onnx conversion (imports TensorFlow) of a Keras model, BatchNormalization scales computed in float64
    (:mod:`resnet8ptq.batchnorm_fold`), or of a float .tflite (whose converter folded them already), its one
    input named ``input`` and its batch left free."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import onnx
    import tensorflow as tf
    import tf2onnx

    from resnet8ptq.batchnorm_fold import float64_batchnorm

    if model_format(source) == "tflite":
        try:
            model_proto, _ = tf2onnx.convert.from_tflite(str(source), opset=ONNX_OPSET)
        except Exception as err:  # tf2onnx raises many types for what it cannot convert
            raise ModelError(f"tf2onnx could not convert {source}: {err}") from err
        onnx.save(dequantized_constants(free_batch(model_proto)), out)
        return
    keras_model = load_keras(source)
    if not isinstance(keras_model.input_shape, tuple):
        raise ModelError(f"{source}: the model has {len(keras_model.inputs)} inputs; the tool takes one.")
    spec = (tf.TensorSpec((None, *keras_model.input_shape[1:]), tf.float32, name=INPUT_NAME),)
    with float64_batchnorm(tf):
        model_proto, _ = tf2onnx.convert.from_keras(keras_model, input_signature=spec, opset=ONNX_OPSET)
    onnx.save(model_proto, out)


def dequantized_constants(model):
    """The graph with each DequantizeLinear of constants (a .tflite's weights stored in int8 beside float
    activations, as MLPerf Tiny's "float32" KWS model holds five of its convolutions') replaced by the float
    constant it computes, ``(q - zero_point) * scale`` along its axis: the float model those weights define,
    which every backend then quantizes as its own."""
    import numpy as np
    from onnx import numpy_helper

    graph = model.graph
    constants = {init.name: init for init in graph.initializer}
    for node in [n for n in graph.node if n.op_type == "DequantizeLinear"]:
        if not all(name in constants for name in node.input if name):
            continue
        q, scale, *rest = (numpy_helper.to_array(constants[name]) for name in node.input if name)
        zero_point = rest[0] if rest else np.zeros_like(scale, dtype=np.int32)
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        shape = [1] * q.ndim
        if scale.ndim == 1 and scale.size > 1:
            shape[axis] = scale.size
        values = (q.astype(np.float32) - zero_point.astype(np.float32).reshape(shape)) * scale.astype(
            np.float32
        ).reshape(shape)
        graph.initializer.append(numpy_helper.from_array(values.astype(np.float32), node.output[0]))
        graph.node.remove(node)
    return _without_dead_nodes(model)


def named_input(model):
    """The model with its one graph input named ``input`` (:data:`INPUT_NAME`), as every backend feeds it."""
    graph = model.graph
    if len(graph.input) != 1:
        raise ModelError(f"the model has {len(graph.input)} inputs; the tool takes one.")
    old = graph.input[0].name
    for node in graph.node:
        node.input[:] = [INPUT_NAME if name == old else name for name in node.input]
    graph.input[0].name = INPUT_NAME
    return model


def free_batch(model):
    """A converted .tflite's graph with its one input named ``input`` and the batch dimension of its input
    and output free (a .tflite fixes it at 1)."""
    graph = named_input(model).graph
    for info in [graph.input[0], *graph.output]:
        dims = info.type.tensor_type.shape.dim
        if dims:
            dims[0].dim_param = "N"
    return model


def _pre_process(raw: Path, out: Path) -> None:
    """ORT's quantization pre-processing: shape inference and graph optimisation (folds the BatchNorms into
    convolutions), then the BatchNorms after dense layers folded (:func:`fold_into_dense`)."""
    import onnx
    from onnxruntime.quantization.shape_inference import quant_pre_process

    from resnet8ptq.batchnorm_fold import fold_into_dense

    static = raw.with_name("static.onnx")
    save_onnx(static_reshapes(onnx.load(raw)), static)
    quant_pre_process(static, out)
    save_onnx(sorted_initializers(numbered_dims(fold_into_dense(onnx.load(out)))), out)


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
    and torch.export sees a static reshape. A Squeeze or Unsqueeze of static output (Keras'
    GlobalAveragePooling2D becomes GlobalAveragePool -> Squeeze) becomes such a Reshape too: onnx2torch reads
    its axes at run time, which torch.export refuses as data-dependent."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True).graph
    shapes = {info.name: info.type.tensor_type.shape.dim for info in [*inferred.value_info, *inferred.output]}
    for node in model.graph.node:
        dims = shapes.get(node.output[0], [])
        name = f"{node.output[0]}/static_shape"
        reshaping = node.op_type in ("Reshape", "Squeeze", "Unsqueeze")
        if not reshaping or node.input[1:2] == [name] or len(dims) < 2:
            continue
        if all(dim.HasField("dim_value") for dim in dims[1:]):
            target = np.array([-1, *(dim.dim_value for dim in dims[1:])], dtype=np.int64)
            model.graph.initializer.append(numpy_helper.from_array(target, name))
            node.op_type = "Reshape"
            node.input[:] = [node.input[0], name]
            del node.attribute[:]  # a Squeeze's axes (opsets before 13)
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


if __name__ == "__main__":  # the conversion child process: python -m resnet8ptq.model SOURCE OUT
    try:
        to_onnx_in_this_process(Path(sys.argv[1]), Path(sys.argv[2]))
    except ModelError as error:
        sys.exit(f"ModelError: {error}")
