"""One quantized run's layers in the run explorer: its integer weights, scales and zero points (read from its
saved model through the package's integer readers), matched with the FP32 layers, their grids and errors."""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from resnet8ptq.explore.store import client_for, model_file


@dataclass(frozen=True)
class Fp32Layer:
    """A conv/dense layer of the canonical FP32 ONNX model (BatchNorms folded): the model every backend
    quantizes (TFLite quantizes the Keras model it comes from, whose folded weights are the same)."""

    weight_name: str  # layer_name() of its weight: what analysis/layer_sqnr.csv names the weight
    node: str  # the ONNX node's name (PyTorch programs are named after it)
    outputs: tuple[str, ...]  # layer_name() of its output, and of the ReLU right after it if one
    weight: np.ndarray = field(repr=False)  # float32 (O, I, kh, kw); a dense layer (O, I, 1, 1)

    @property
    def label(self) -> str:
        return f"{self.weight_name} ({'×'.join(str(d) for d in self.weight.shape)})"


def fp32_layers(onnx_path: Path) -> list[Fp32Layer]:
    """The conv and dense (Gemm) layers of the canonical FP32 ONNX model, in graph order."""
    import onnx
    from onnx import numpy_helper

    from resnet8ptq.model import layer_name

    graph = onnx.load(str(onnx_path)).graph
    constants = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    layers = []
    for node in graph.node:
        if node.op_type not in ("Conv", "Gemm"):
            continue
        weight = constants[node.input[1]].astype(np.float32)
        if node.op_type == "Gemm":
            transposed = any(a.name == "transB" and a.i for a in node.attribute)
            weight = (weight if transposed else weight.T)[:, :, None, None]
        outputs = [node.output[0]]
        after = consumers.get(node.output[0], [])
        if len(after) == 1 and after[0].op_type == "Relu":
            outputs.append(after[0].output[0])
        layers.append(
            Fp32Layer(layer_name(node.input[1]), node.name, tuple(layer_name(o) for o in outputs), weight)
        )
    return layers


@dataclass
class LayerWeights:
    """One conv/dense layer of a quantized run: its stored integers, per-channel scales and zero points, the
    integer grid they live on, and the FP32 weights it was quantized from (None when not matched)."""

    layer: str  # the FP32 layer's weight name, or the run's own name when unmatched
    name: str  # the layer's name in the run's integer form
    integers: np.ndarray  # int (O, I, kh, kw)
    zero_point: np.ndarray  # int (O,)
    scale: np.ndarray  # float (O,)
    qmin: int
    qmax: int
    fp32: np.ndarray | None  # float32 (O, I, kh, kw)
    matched_by: str  # how the FP32 layer was found: "name" or "weight values (N dB)"
    outputs: tuple[str, ...] = ()  # the FP32 layer's output names (its activation rows in layer_sqnr.csv)

    @property
    def channels(self) -> int:
        return len(self.scale)

    def select(self, channel: int | None) -> LayerWeights:
        """The layer cut to one output channel (None or negative: every channel)."""
        if channel is None or channel < 0:
            return self
        keep = slice(channel, channel + 1)
        fp32 = None if self.fp32 is None else self.fp32[keep]
        return replace(
            self,
            integers=self.integers[keep],
            zero_point=self.zero_point[keep],
            scale=self.scale[keep],
            fp32=fp32,
        )

    def dequantized(self) -> np.ndarray:
        return dequantize(self.integers, self.scale, self.zero_point)

    def on_grid_ends(self) -> float | None:
        """The share of stored integers at qmin or qmax; None when some lie outside (the grid is unknown)."""
        return grid_ends_share(self.integers, self.qmin, self.qmax)

    def clipped(self) -> float | None:
        """The share of FP32 weights beyond the grid's reach (rounded onto it, they would be clipped)."""
        if self.fp32 is None:
            return None
        return clipped_share(self.fp32, self.scale, self.zero_point, self.qmin, self.qmax)


def dequantize(integers: np.ndarray, scale: np.ndarray, zero_point: np.ndarray) -> np.ndarray:
    """(q - zp) · scale per output channel (axis 0)."""
    shape = (-1,) + (1,) * (integers.ndim - 1)
    centered = integers.astype(np.float64) - np.reshape(zero_point, shape)
    return (centered * np.reshape(scale, shape).astype(np.float64)).astype(np.float32)


def grid_ends_share(integers: np.ndarray, qmin: int, qmax: int) -> float | None:
    """The share of integers equal to qmin or qmax (None if any lies outside [qmin, qmax])."""
    if integers.size == 0 or integers.min() < qmin or integers.max() > qmax:
        return None
    return float(np.mean((integers == qmin) | (integers == qmax)))


def clipped_share(fp32: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, qmin: int, qmax: int) -> float:
    """The share of FP32 weights whose nearest grid point round(w / scale) + zp lies outside [qmin, qmax]."""
    shape = (-1,) + (1,) * (fp32.ndim - 1)
    nearest = np.rint(fp32.astype(np.float64) / np.reshape(scale, shape)) + np.reshape(zero_point, shape)
    return float(np.mean((nearest < qmin) | (nearest > qmax)))


def weight_range(tags: Mapping[str, str]) -> tuple[int, int]:
    """The integer grid of the run's weights, by the tool's rule (:mod:`resnet8ptq.dtype`: ORT's, which the
    PyTorch observers follow; TFLite's int8 weights are the signed symmetric grid too) from the run's
    read-back tags ``dtype.weight``, ``dtype.weight_bits``, ``per_channel`` and ``reduce_range``."""
    from resnet8ptq.dtype import DtypeConfig

    weight = tags.get("dtype.weight", "int8")
    dtype = DtypeConfig(activation="int8", weight=weight, weight_bits=int(tags.get("dtype.weight_bits", 8)))
    symmetric = dtype.weight_symmetric(tags.get("per_channel", "false") == "true")
    return dtype.weight_range(symmetric, tags.get("reduce_range", "false") == "true")


def match_layers(
    convs: Sequence, fp32: Sequence[Fp32Layer], onnx_node_of: Mapping[str, str] | None = None
) -> list[tuple[object, Fp32Layer | None, str]]:
    """Pair each conv/dense layer of a run's integer form with the FP32 layer it quantizes:

    1. by name: an ONNX Runtime or TFLite layer is named after its output tensor (``layer_name``), which is
       the FP32 conv's output or the ReLU's right after it; a PyTorch layer after its program node
       (``conv2d_3``), which ``onnx_node_of`` maps to the ONNX node it was exported from;
    2. by weight values, for a layer no name matches (a published model, named after its own Keras graph):
       the FP32 layer of the same shape whose weights the dequantized ones are closest to (highest SQNR,
       at least 10 dB), each FP32 layer taken once.

    Returns (conv, FP32 layer or None, how it was matched)."""
    by_output = {name: layer for layer in fp32 for name in layer.outputs}
    by_node = {layer.node: layer for layer in fp32}
    onnx_node_of = onnx_node_of or {}
    pairs: list[list] = []
    for conv in convs:
        found = by_output.get(conv.name) or by_node.get(onnx_node_of.get(conv.name, ""))
        pairs.append([conv, found, "name" if found else ""])
    from resnet8ptq.layer_errors import tensor_sqnr_db  # the run's own SQNR (resnet8ptq/layer_errors.py)

    taken = {id(layer) for _, layer, _ in pairs if layer is not None}
    for pair in pairs:
        if pair[1] is not None:
            continue
        conv = pair[0]
        values = dequantize(conv.weight, conv.weight_scale, conv.weight_zero_point)
        scored = [
            (tensor_sqnr_db(layer.weight, values), layer)
            for layer in fp32
            if id(layer) not in taken and layer.weight.shape == values.shape
        ]
        if scored:
            best, layer = max(scored, key=lambda item: item[0])
            if best >= 10:
                pair[1], pair[2] = layer, f"weight values ({best:.0f} dB)"
                taken.add(id(layer))
    return [tuple(pair) for pair in pairs]


def backend_class(backend: str, target: str | None = None):
    """The backend's class: the run's ``backend._target_`` param, else the one `conf/backend/<name>.yaml`
    names."""
    from hydra.utils import get_class

    if not target:
        from omegaconf import OmegaConf

        conf = Path(__file__).resolve().parents[1] / "conf" / "backend" / f"{backend}.yaml"
        target = OmegaConf.load(conf)["_target_"]
    return get_class(target)


@functools.lru_cache(maxsize=4)
def torch_onnx_nodes(onnx_path: Path) -> dict[str, str]:
    """PyTorch program node name -> the ONNX node it comes from, for programs made from the canonical model:
    the model is converted and exported again as the torch backend does (``layer_errors.onnx_nodes``; the
    saved programs carry no module metadata), which gives the saved program's node names (quantization
    keeps the compute ops' names)."""
    from resnet8ptq.backends.torch.convert import (
        example_input,
        export,
        input_shape,
        onnx_module,
        onnx_to_torch,
    )

    traced = export(onnx_to_torch(onnx_path), example_input(input_shape(onnx_path)))
    return {node.name: top for node in traced.graph.nodes if (top := onnx_module(node))}


@dataclass
class RunLayers:
    """A quantized run read into layers, or why it could not be."""

    layers: dict[str, LayerWeights]  # by FP32 weight name (the run's own name when unmatched)
    source: str = ""  # the integer reader ("onnx-qdq", "torch-pt2e", "tflite")
    notes: list[str] = field(default_factory=list)
    error: str = ""


@functools.lru_cache(maxsize=32)
def run_layers(uri: str, run_id: str, fp32_path: Path | None) -> RunLayers:
    """The conv/dense layers of a quantized run's saved model, read by its backend's integer reader
    (``Backend.integer_model``) and paired with the FP32 layers of ``fp32_path`` (:func:`match_layers`)."""
    run = client_for(uri).get_run(run_id)
    tags, params = run.data.tags, run.data.params
    path = model_file(uri, run_id)
    if path is None:
        return RunLayers({}, error="the run logged no model (artifact model/)")
    backend = tags.get("backend") or params.get("backend", "")
    try:
        model = backend_class(backend, params.get("backend._target_"))().integer_model(path)
    except Exception as error:  # a reader refuses what it does not cover (16-bit activations, ...)
        return RunLayers({}, error=f"{backend}'s integer reader cannot read {path.name}: {error}")
    fp32 = fp32_layers(fp32_path) if fp32_path else []
    notes = list(model.notes)
    onnx_node_of: dict[str, str] = {}
    if fp32_path and model.source == "torch-pt2e":
        try:
            onnx_node_of = torch_onnx_nodes(fp32_path)
        except Exception as error:  # an export that no longer reproduces the program: match by values
            notes.append(f"PyTorch node names not mapped to ONNX nodes ({error}); matched by weight values.")
    qmin, qmax = weight_range(tags)
    layers = {}
    for conv, layer, how in match_layers(model.convs, fp32, onnx_node_of):
        key = layer.weight_name if layer else conv.name
        layers[key] = LayerWeights(
            layer=key,
            name=conv.name,
            integers=conv.weight,
            zero_point=conv.weight_zero_point,
            scale=conv.weight_scale,
            qmin=qmin,
            qmax=qmax,
            fp32=layer.weight if layer else None,
            matched_by=how or "unmatched",
            outputs=layer.outputs if layer else (conv.name,),
        )
    return RunLayers(layers, model.source, notes)


@functools.lru_cache(maxsize=8)
def fp32_onnx(uri: str, experiment_id: str, h5_sha256: str | None = None) -> tuple[Path | None, str]:
    """The canonical FP32 ONNX model, and where it came from: the model an ONNX FP32 baseline run logged
    (of the same .h5 where the tags say), else the tool's converted-model cache (``cache_dir``: converting
    the .h5 as the tool does if it is not there). (None, why) when neither is to be had."""
    from resnet8ptq.tracking.search import search_all

    conditions = {"tags.backend": "onnx", "tags.quantized": "false", "attributes.status": "FINISHED"}
    baselines = search_all(client_for(uri), [experiment_id], conditions)
    baselines.sort(
        key=lambda r: (r.data.tags.get("model.sha256") == h5_sha256, r.info.start_time), reverse=True
    )
    for run in baselines:
        path = model_file(uri, run.info.run_id)
        if path is not None and path.suffix == ".onnx":
            return path, f"the model of FP32 run {run.info.run_name} ({run.info.run_id[:8]})"
    try:
        from resnet8ptq.model import MODEL_SHA256, canonical_onnx, resolve_source

        cache = Path(os.environ.get("RESNET8PTQ_CACHE") or Path.home() / ".cache" / "resnet8ptq")
        h5, sha256 = resolve_source(None, h5_sha256 or MODEL_SHA256, cache)
        return canonical_onnx(h5, sha256, cache).onnx_path, f"the tool's converted model in {cache}"
    except Exception as error:  # no baseline run, no model: the layer view shows no FP32 weights
        return None, f"no ONNX FP32 baseline run in the store, and the tool's conversion failed: {error}"


def layer_sqnr(table: pd.DataFrame | None, layer: LayerWeights) -> tuple[float | None, str, float | None]:
    """(weight SQNR, output tensor name, output SQNR) of a layer from the run's ``analysis/layer_sqnr.csv``.
    Weights are named after their Keras layer there in every backend (``conv2d_1``; the dense weight is
    ``dense_1/Cast`` in ONNX, ``dense_1/MatMul`` in TFLite), so they are matched on that first part; the
    output is the layer's FP32 output or its ReLU's, whichever the run quantized (a PyTorch conv fused with
    its residual add has none of its own)."""
    if table is None or table.empty:
        return None, "", None
    weights = table[table["kind"] == "weight"]
    keras = weights["layer"].str.split("/").str[0]
    weight = weights.loc[keras == layer.layer.split("/")[0], "sqnr_db"]
    activations = table[table["kind"] == "activation"].set_index("layer")["sqnr_db"]
    output = next((name for name in reversed(layer.outputs) if name in activations.index), "")
    return (
        float(weight.iloc[0]) if len(weight) else None,
        output,
        float(activations[output]) if output else None,
    )
