"""The run explorer's reading of an MLflow tracking store: the runs as a table, a run's artifacts and model
file (downloaded once per process: a finished run's files do not change), its logged predictions, the test
images as thumbnails."""

from __future__ import annotations

import atexit
import functools
import io
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

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


def table_columns(table: pd.DataFrame) -> list[str]:
    """The runs table's columns: :data:`TABLE_COLUMNS`, then each metric of a stage added as a module
    (:mod:`resnet8ptq.stages`) that some run in ``table`` logged."""
    from resnet8ptq.tracking.schema import stage_names

    added = [name for name in stage_names("metric") if name in table and table[name].notna().any()]
    return [*TABLE_COLUMNS[:-2], *added, *TABLE_COLUMNS[-2:]]


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


PREDICTION_SOURCES = {
    "evaluation": ("evaluation/predictions.csv", "predicted"),  # reference semantics, every run
    "device": ("device/predictions.csv", "device"),  # the device model's, device runs only
}


def predictions(uri: str, run_id: str, source: str = "evaluation") -> pd.DataFrame | None:
    """A run's logged predictions as (image, label, predicted), indexed by test-set image, or None (none
    logged, or an AUC run's: scores, not predicted classes)."""
    path, column = PREDICTION_SOURCES[source]
    table = csv_artifact(uri, run_id, path)
    if table is None or column not in table:
        return None
    return table.rename(columns={column: "predicted"})[["image", "label", "predicted"]].set_index("image")


def disagreements(a: pd.DataFrame, b: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The test images A predicts right and B wrong, and those B predicts right and A wrong (image indices,
    ascending). Raises ``ValueError`` when the two tables are not of the same images and labels."""
    if not a.index.equals(b.index) or not a["label"].equals(b["label"]):
        raise ValueError("the two runs' predictions are not of the same test images and labels")
    right_a, right_b = a["predicted"] == a["label"], b["predicted"] == b["label"]
    return a.index[right_a & ~right_b].to_numpy(), a.index[right_b & ~right_a].to_numpy()


def class_names(tags: Mapping[str, str], metrics: Mapping[str, float]) -> tuple[str, ...]:
    """A run's classes in label order (its ``classes`` tag; CIFAR-10's for a ResNet8 run made before it)."""
    from resnet8ptq.report.classes import run_classes

    return run_classes(tags, metrics, tags.get("model", "resnet8"))


def class_accuracy(tags: Mapping[str, str], metrics: Mapping[str, float]) -> pd.Series:
    """The logged per-class accuracy (metrics ``class_acc/<class>``) in the run's class order."""
    names = class_names(tags, metrics)
    return pd.Series([metrics.get(f"class_acc/{name}", np.nan) for name in names], index=list(names))


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


def where_runs_part(uri: str, run_a: str, run_b: str) -> pd.DataFrame:
    """Two runs of the store compared stage by stage, as `python -m resnet8ptq.diff` compares them: one row
    per stage (configuration, versions, hardware, calibration sample, ranges, model, integer form,
    predictions, device predictions) with what differs there, ``same`` where nothing does."""
    from resnet8ptq.diff import differences, side

    found = differences(side(run_a, uri), side(run_b, uri))
    return pd.DataFrame(
        [(stage, "same" if what is None else what) for stage, what in found], columns=["stage", "difference"]
    )


def sweep_runs(uri: str, sweep_id: str) -> list:
    """A sweep's runs as its report counts them: its children and the earlier runs it reused."""
    from resnet8ptq.report.writer import reused_runs
    from resnet8ptq.tracking.search import search_all

    client = client_for(uri)
    parent = client.get_run(sweep_id)
    children = search_all(client, [parent.info.experiment_id], {"tags.mlflow.parentRunId": sweep_id})
    return [*children, *reused_runs(client, parent, children)]
