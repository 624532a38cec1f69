"""What the run explorer (``explore/runs.py``) shows, read from an MLflow tracking store: the runs as a table,
one quantized run's layers (integer weights, scales, zero points, against the FP32 weights), two runs'
logged predictions side by side, and a sweep's accuracy maps. Everything comes from what the runs logged
(tags, metrics, artifacts, the saved models): nothing here evaluates a model or computes an accuracy.

No marimo here: the notebook draws, this module reads and reshapes (unit-tested in
``tests/unit/test_explorer.py``). Reading a run (its artifacts, its model into integer layers) is cached per
run for the life of the process: a finished run's files do not change.
"""

from __future__ import annotations

import atexit
import functools
import io
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"  # the tool's own default store (MLflow's)
DEFAULT_EXPERIMENT = "resnet8ptq"
DEFAULT_UI = "http://127.0.0.1:5000"  # where `make ui` serves a local store
MODEL_SUFFIXES = (".onnx", ".pt2", ".tflite")

FILTERS = {  # runs-table column -> label: the tags the MLflow UI's runs table shows
    "backend": "backend",
    "dtype": "dtype",
    "calib": "calibration",
    "per_channel": "per-channel",
    "bits": "bits (activation/weight)",
    "algo": "algorithm",
    "device": "device",
}
TABLE_COLUMNS = [
    "run_name",
    "status",
    "backend",
    "dtype",
    "bits",
    "calib",
    "per_channel",
    "algo",
    "device",
    "accuracy_pct",
    "delta_points",
    "accuracy_device_pct",
    "sweep",
    "run_id",
]
BITS_GROUP = [
    "backend",
    "activation",
    "weight",
    "first_last_bits",
    "calib",
    "per_channel",
    "algo",
    "reduce_range",
]
"""What a bit-width map holds fixed: every setting of a run's quantization but its two widths."""
QUANTIZATION_GROUP = [
    "backend",
    "dtype",
    "bits",
    "first_last_bits",
    "calib",
    "per_channel",
    "algo",
    "reduce_range",
]
"""What a device map holds fixed besides the device settings it does not map: the quantization."""


# --- the store ------------------------------------------------------------------------------------------


def tracking_uri(args: Mapping[str, object], environ: Mapping[str, str] = os.environ) -> str:
    """The store to read: ``--tracking-uri``, else ``$MLFLOW_TRACKING_URI``, else the tool's default."""
    return str(args.get("tracking-uri") or environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI)


def ui_base(uri: str, ui: object = None) -> str:
    """The MLflow UI the map cells link to: ``--ui``, else the tracking server itself, else `make ui`'s."""
    if ui:
        return str(ui).rstrip("/")
    return uri.rstrip("/") if uri.startswith(("http://", "https://")) else DEFAULT_UI


def run_url(ui: str, experiment_id: str, run_id: str) -> str:
    """A run's page in the MLflow UI."""
    return f"{ui}/#/experiments/{experiment_id}/runs/{run_id}"


def client_for(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(uri)


def experiment_runs(uri: str, experiment: str) -> tuple[str, list, list]:
    """(experiment id, its runs, its sweep (parent) runs), newest first. Raises ``LookupError``, saying what
    to do, when the store has no such experiment."""
    from resnet8ptq.tracking.search import search_all

    client = client_for(uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        names = [e.name for e in client.search_experiments()]
        raise LookupError(
            f"No experiment {experiment!r} in the tracking store {uri} (it has: "
            f"{', '.join(names) or 'none'}). Give the store of your sweeps (--tracking-uri, or "
            f"MLFLOW_TRACKING_URI) or --experiment."
        )
    runs = sorted(
        search_all(client, [found.experiment_id], {}), key=lambda r: r.info.start_time or 0, reverse=True
    )
    sweeps = [run for run in runs if run.data.tags.get("sweep") == "true"]
    return found.experiment_id, runs, sweeps


def runs_table(runs: Iterable, sweeps: Iterable = ()) -> pd.DataFrame:
    """One row per (non-sweep) run, as the comparison report reads runs (``report.runs.runs_frame``), with
    the explorer's filter columns: ``bits`` (``a8w8``), ``device`` (``none`` without one) and ``sweep`` (the
    parent run's name). Newest first."""
    from resnet8ptq.report.runs import runs_frame

    runs = list(runs)
    frame = runs_frame(runs)
    if frame.empty:
        derived = [*TABLE_COLUMNS, "kind", "parent"]
        return frame.assign(**{column: pd.Series(dtype=object) for column in derived if column not in frame})
    names = {run.info.run_id: run.info.run_name for run in sweeps}
    parents = {run.info.run_id: run.data.tags.get("mlflow.parentRunId", "") for run in runs}
    frame["kind"] = np.where(
        ~frame["quantized"], "fp32", np.where(frame["reference"].fillna("") != "", "published", "quantized")
    )
    frame["bits"] = [
        "fp32" if not quantized else f"a{a}w{w}"
        for quantized, a, w in zip(
            frame["quantized"], frame["activation_bits"], frame["weight_bits"], strict=True
        )
    ]
    frame["device"] = frame["device"].replace("", "none")
    for column in ("calib", "per_channel", "algo", "reduce_range"):
        frame[column] = frame[column].replace("", "—")
    frame["accuracy_pct"] = frame["accuracy"] * 100
    frame["delta_points"] = frame["accuracy_delta"] * 100
    frame["accuracy_device_pct"] = frame["accuracy_device"] * 100
    frame["sweep"] = [names.get(parents.get(run_id, ""), "") for run_id in frame["run_id"]]
    frame["parent"] = [parents.get(run_id, "") for run_id in frame["run_id"]]
    return frame.sort_values("start_time", ascending=False, kind="stable").reset_index(drop=True)


def filter_runs(table: pd.DataFrame, chosen: Mapping[str, Sequence[str]]) -> pd.DataFrame:
    """The rows whose value in each filter column is one of the chosen ones (nothing chosen: any)."""
    keep = pd.Series(True, index=table.index)
    for column, values in chosen.items():
        if values:
            keep &= table[column].astype(str).isin([str(v) for v in values])
    return table[keep]


def default_layer_runs(table: pd.DataFrame, limit: int = 4) -> list[str]:
    """The runs the layer view opens on: the newest finished quantized run of each backend (not a published
    model's), backends in the order their newest run appears."""
    own = table[(table["kind"] == "quantized") & (table["status"] == "FINISHED")]
    return own.drop_duplicates("backend")["run_id"].tolist()[:limit]


# --- a run's files ----------------------------------------------------------------------------------------


@functools.cache
def _downloads() -> Path:
    """This process's directory of downloaded artifacts (removed when the process ends)."""
    path = Path(tempfile.mkdtemp(prefix="resnet8ptq-explore-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


@functools.lru_cache(maxsize=512)
def artifact(uri: str, run_id: str, path: str) -> Path | None:
    """A run's artifact file, downloaded once per process (None when the run did not log it)."""
    client = client_for(uri)
    directory, _, name = path.rpartition("/")
    if name not in {Path(item.path).name for item in client.list_artifacts(run_id, directory or None)}:
        return None
    destination = _downloads() / run_id
    destination.mkdir(parents=True, exist_ok=True)
    return Path(client.download_artifacts(run_id, path, str(destination)))


@functools.lru_cache(maxsize=256)
def model_file(uri: str, run_id: str) -> Path | None:
    """The run's saved model (artifact ``model/``: ``.onnx``, ``.pt2`` or ``.tflite``), or None."""
    items = client_for(uri).list_artifacts(run_id, "model")
    names = [item.path for item in items if item.path.endswith(MODEL_SUFFIXES)]
    return artifact(uri, run_id, names[0]) if names else None


def csv_artifact(uri: str, run_id: str, path: str, **read: object) -> pd.DataFrame | None:
    found = artifact(uri, run_id, path)
    return None if found is None else pd.read_csv(found, **read)


# --- one run's layers ---------------------------------------------------------------------------------------


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
        from resnet8ptq.model import MODEL_SHA256, canonical_onnx, resolve_h5

        cache = Path(os.environ.get("RESNET8PTQ_CACHE") or Path.home() / ".cache" / "resnet8ptq")
        h5, sha256 = resolve_h5(None, h5_sha256 or MODEL_SHA256, cache)
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


# --- two runs side by side ----------------------------------------------------------------------------------

PREDICTION_SOURCES = {
    "evaluation": ("evaluation/predictions.csv", "predicted"),  # reference semantics, every run
    "device": ("device/predictions.csv", "device"),  # the device model's, device runs only
}


def predictions(uri: str, run_id: str, source: str = "evaluation") -> pd.DataFrame | None:
    """A run's logged predictions as (image, label, predicted), indexed by test-set image, or None."""
    path, column = PREDICTION_SOURCES[source]
    table = csv_artifact(uri, run_id, path)
    if table is None:
        return None
    return table.rename(columns={column: "predicted"})[["image", "label", "predicted"]].set_index("image")


def disagreements(a: pd.DataFrame, b: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The test images A predicts right and B wrong, and those B predicts right and A wrong (image indices,
    ascending). Raises ``ValueError`` when the two tables are not of the same images and labels."""
    if not a.index.equals(b.index) or not a["label"].equals(b["label"]):
        raise ValueError("the two runs' predictions are not of the same test images and labels")
    right_a, right_b = a["predicted"] == a["label"], b["predicted"] == b["label"]
    return a.index[right_a & ~right_b].to_numpy(), a.index[right_b & ~right_a].to_numpy()


def class_accuracy(metrics: Mapping[str, float]) -> pd.Series:
    """The logged per-class accuracy (metrics ``class_acc/<class>``) in CIFAR-10's class order."""
    from resnet8ptq.data import CLASS_NAMES

    return pd.Series([metrics.get(f"class_acc/{name}", np.nan) for name in CLASS_NAMES], index=CLASS_NAMES)


def confusion(uri: str, run_id: str) -> pd.DataFrame | None:
    """The logged confusion matrix (rows: true class, columns: predicted)."""
    return csv_artifact(uri, run_id, "evaluation/confusion_matrix.csv", index_col=0)


def data_root(args: Mapping[str, object], environ: Mapping[str, str] = os.environ) -> Path:
    """Where CIFAR-10 is, for thumbnails: ``--data-root``, else ``$RESNET8PTQ_ASSETS``, else the tool's
    default ``data/``."""
    from resnet8ptq.fetch import ASSETS_ENV

    return Path(str(args.get("data-root") or environ.get(ASSETS_ENV) or "data"))


@functools.lru_cache(maxsize=2)
def test_set(root: Path) -> tuple[np.ndarray, np.ndarray]:
    """CIFAR-10's test images (N, 32, 32, 3) uint8 and labels, verified and read as the tool reads them."""
    from resnet8ptq.data import load_cifar10

    data = load_cifar10(root, download=False)
    return data.test_images, data.test_labels


def thumbnail(image: np.ndarray, scale: int = 3) -> bytes:
    """A 32×32 image as a PNG ``scale`` times larger (nearest neighbour: the pixels stay visible)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.kron(image, np.ones((scale, scale, 1), np.uint8))).save(buffer, format="PNG")
    return buffer.getvalue()


# --- a sweep's maps -----------------------------------------------------------------------------------------


def sweep_runs(uri: str, sweep_id: str) -> list:
    """A sweep's runs as its report counts them: its children and the earlier runs it reused."""
    from resnet8ptq.report.writer import reused_runs
    from resnet8ptq.tracking.search import search_all

    client = client_for(uri)
    parent = client.get_run(sweep_id)
    children = search_all(client, [parent.info.experiment_id], {"tags.mlflow.parentRunId": sweep_id})
    return [*children, *reused_runs(client, parent, children)]


class Cell(NamedTuple):
    """A map's cell: the mean of ``value`` over its runs' calibration samples (``data.seed``; the newest
    run of each), their standard deviation (NaN for one) and number, and the newest run (the link)."""

    value: float
    run_id: str
    run_name: str
    std: float = float("nan")
    seeds: int = 1


@dataclass
class Map:
    """A grid of runs: each (row, column) cell's value and the run it links to."""

    title: str
    row_name: str
    column_name: str
    rows: list
    columns: list
    cells: dict[tuple, Cell]


def accuracy_maps(
    table: pd.DataFrame, row: str, column: str, value: str, group: Sequence[str], title: str = ""
) -> list[Map]:
    """One map per combination of the ``group`` columns (one map when there are none): ``value`` (a logged
    metric) by ``row`` × ``column``, from a :func:`runs_table`. Where several finished runs fall in one cell,
    the newest (``start_time``) of each seed counts and the cell is their mean ± std, as the comparison
    report's map shows it."""
    finished = table[(table["status"] == "FINISHED") & table[value].notna()]
    finished = finished.sort_values("start_time", ascending=False, kind="stable")
    group = list(group)
    groups = finished.groupby(group, sort=True, dropna=False) if group else [((), finished)]
    maps = []
    for key, runs in groups:
        if not len(runs):
            continue
        key = key if isinstance(key, tuple) else (key,)
        cells: dict[tuple, Cell] = {}
        for cell, seeds in runs.groupby([row, column], sort=False, dropna=False):
            newest = seeds.iloc[0]
            values = seeds.drop_duplicates("seed")[value].astype(float)
            std = float(values.std(ddof=1)) if len(values) > 1 else float("nan")
            cells[cell] = Cell(float(values.mean()), newest["run_id"], newest["run_name"], std, len(values))
        described = ", ".join(f"{name}={_shown(v)}" for name, v in zip(group, key, strict=True))
        maps.append(
            Map(
                title=f"{title}{described}" if described else title or "all runs",
                row_name=row,
                column_name=column,
                rows=sorted({r for r, _ in cells}, key=_order),
                columns=sorted({c for _, c in cells}, key=_order),
                cells=cells,
            )
        )
    return maps


def varying(table: pd.DataFrame, columns: Iterable[str]) -> list[str]:
    """The columns with more than one distinct value (NaN counting as a value) in ``table``."""
    return [c for c in columns if c in table and table[c].astype(str).nunique(dropna=False) > 1]


def fixed(table: pd.DataFrame, columns: Iterable[str]) -> str:
    """The columns with one value in ``table``, as ``name=value, ...``."""
    if table.empty:
        return ""
    return ", ".join(
        f"{c}={_shown(table[c].iloc[0])}" for c in columns if c in table and c not in varying(table, [c])
    )


def _order(value: object) -> tuple:
    """Numbers ascending, then everything else as text (NaN: ideal/unset, last)."""
    if isinstance(value, int | float | np.integer | np.floating) and not pd.isna(value):
        return (0, float(value), "")
    return (1, 0.0, str(value))


def _shown(value: object) -> str:
    if isinstance(value, float) and np.isnan(value):
        return "ideal"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def cell_color(value: float, low: float, high: float) -> str:
    """A background for ``value`` on a scale from ``low`` (red) through yellow to ``high`` (green)."""
    t = 1.0 if high <= low else min(max((value - low) / (high - low), 0.0), 1.0)
    stops = [(215, 48, 39), (254, 224, 139), (26, 152, 80)]
    i = 0 if t < 0.5 else 1
    u = t * 2 - i
    rgb = [round(a + (b - a) * u) for a, b in zip(stops[i], stops[i + 1], strict=True)]
    return f"rgb({rgb[0]}, {rgb[1]}, {rgb[2]})"


def map_html(grid: Map, link: Callable[[str], str], scale: float = 100.0, digits: int = 2) -> str:
    """The map as an HTML table, each cell the value (× ``scale``; ``mean ± std`` over seeds) linking to its
    run (``link(run_id)``), coloured from the map's lowest to its highest value."""
    from html import escape

    values = [cell.value for cell in grid.cells.values()]
    low, high = min(values), max(values)
    head = "".join(f"<th>{escape(_shown(c))}</th>" for c in grid.columns)
    lines = [
        '<table class="accuracy-map" style="border-collapse: collapse; text-align: center;">',
        f"<caption>{escape(grid.title)}</caption>",
        f"<tr><th>{escape(grid.row_name)} \\ {escape(grid.column_name)}</th>{head}</tr>",
    ]
    for r in grid.rows:
        cells = []
        for c in grid.columns:
            if (r, c) not in grid.cells:
                cells.append("<td>—</td>")
                continue
            value, run_id, name, std, seeds = grid.cells[r, c]
            shown = f"{value * scale:.{digits}f}" + (f" ± {std * scale:.{digits}f}" if seeds > 1 else "")
            if seeds > 1:
                name = f"mean ± std of {seeds} seeds (data.seed); links to the newest: {name}"
            cells.append(
                f'<td style="background: {cell_color(value, low, high)}; padding: 4px 10px;">'
                f'<a href="{escape(link(run_id))}" target="_blank" title="{escape(name)}" '
                f'style="color: black;">{shown}</a></td>'
            )
        lines.append(f"<tr><th>{escape(_shown(r))}</th>{''.join(cells)}</tr>")
    lines.append("</table>")
    return "\n".join(lines)
