"""Tracked runs as a table: a row per run with its settings, tags and metrics, cut and sorted to compare."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields

import numpy as np
import pandas as pd
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from resnet8ptq.components.config import COMPONENTS, costing_label
from resnet8ptq.data import CLASS_NAMES
from resnet8ptq.device.config import Crossbar, DeviceConfig
from resnet8ptq.errors import ReportError
from resnet8ptq.hardware import Hardware
from resnet8ptq.metrics import as_accuracy
from resnet8ptq.records import REFERENCE_TAG
from resnet8ptq.report.classes import CLASS_METRIC, run_classes
from resnet8ptq.statistics import accuracy_interval
from resnet8ptq.tracking import schema
from resnet8ptq.tracking.identity import ADDED_DEFAULTS, config_hash
from resnet8ptq.tracking.search import where

TEST_COLUMNS = (  # paired tests' p-values (significance.paired_tests)
    "p_vs_fp32",
    "p_vs_fp32_holm",
    "p_vs_best",
    "p_vs_best_holm",
    "p_vs_published",
    "p_vs_published_holm",
)
TEST_IMAGES = 10_000  # every run is evaluated on the whole CIFAR-10 test set
ROLES = ("activation", "weight")


EMPTY_COLUMNS = [
    "run_id",
    "run_name",
    "status",
    "start_time",
    "quantized",
    "backend",
    "dtype",
    "activation",
    "weight",
    "activation_bits",
    "weight_bits",
    "first_last_bits",
    "calib",
    "algo",
    "per_channel",
    "reduce_range",
    "execution",
    "execution_reason",
    "hardware",
    "int8_dot_product",
    "config_hash",
    "seed",
    "settings",
    "error",
    "sqnr_worst_layer",
    "raised",
    "raised_count",
    "base_hash",
    "budget",
    "layer_bits",
    "reference",
    "device",
    "device_config",
    "mcu_fits",
    "cost_model",
    "metric",
    "quality_target",
]  # fmt: skip  (the columns runs_frame gives every run)


CHIP_METRICS = (
    "device_energy_uj",
    "device_latency_us",
    "device_area_mm2",
    "device_tops_per_w",
    "device_tops_per_mm2",
    "device_array_utilisation",
    *(f"device_energy_uj_{name}" for name in COMPONENTS),
)
"""A costed device run's chip (resnet8ptq/components/): energy, latency, area, efficiency, energy by
component."""
METRIC_COLUMNS = (
    "accuracy",
    "accuracy_device",
    "accuracy_device_ci_low",
    "accuracy_device_ci_high",
    "accuracy_device_std",
    "accuracy_device_perf_subset",
    "device_differing_predictions",
    "accuracy_perf_subset",
    "accuracy_ci_low",
    "accuracy_ci_high",
    "accuracy_delta",
    "accuracy_native",
    "kernel_gap_points",
    "model_size_bytes",
    "fp32_size_bytes",
    "throughput_img_s",
    "latency_ms_b1",
    "sqnr_activation_min_db",
    "sqnr_weight_min_db",
    *("accuracy_mcu", "accuracy_mcu_reference", "mcu_images", "mcu_differing_predictions"),
    "mcu_arena_bytes",
    "mcu_flash_bytes",
    "npu_cycles",
    "npu_inference_ms",
    "bops",
    "weight_memory_bits",
    *CHIP_METRICS,
    *(f"{CLASS_METRIC}{name}" for name in CLASS_NAMES),
)


def runs_frame(runs: Iterable[Run]) -> pd.DataFrame:
    """One row per (non-sweep) run: identity, status, settings and metrics (accuracy as a fraction). A run
    of a model scored by AUC (tag ``metric``) has its ``auc*`` metrics in the ``accuracy*`` columns (the
    report ranks and compares each network by its own metric: :func:`metric_note` says so), its MLPerf
    quality target in ``quality_target``.

    A published model's run (tag ``reference``) is a quantized row with its publisher in ``reference`` and
    no settings of this tool (calib, per-channel, algo)."""
    rows = []
    for run in runs:
        tags, params, metrics = run.data.tags, run.data.params, run.data.metrics
        if tags.get("sweep") == "true":
            continue
        quantized = tags.get("quantized") != "false"
        reference = tags.get(REFERENCE_TAG, "")
        made_here = quantized and not reference  # a configuration of this tool, with its settings
        activation = tags.get("dtype.activation") or params.get("dtype.activation", "?")
        weight = tags.get("dtype.weight") or params.get("dtype.weight", "?")
        bits = [
            int(tags.get(f"dtype.{role}_bits") or params.get(f"dtype.{role}_bits") or 8) for role in ROLES
        ]
        dtype = params.get("dtype") or f"{activation}/{weight}"  # the `dtype` choice, e.g. u8s8
        if reference:
            dtype = activation if activation == weight else f"{activation}/{weight}"
        mixed = bool(tags.get("layer_bits"))  # layers of their own width (read back), e.g. a budgeted mix
        if mixed:  # the narrowest widths read back say little: the configured ones of the other layers
            rest = [params.get(f"dtype.{role}_bits", "8") for role in ROLES]
            dtype += f" mixed (rest a{rest[0]}w{rest[1]})"
        elif bits != [8, 8] and dtype != f"a{bits[0]}w{bits[1]}":
            dtype += f" a{bits[0]}w{bits[1]}"  # widths set apart from the choice
        # The papers' convention, read back (tag "8 bits (read back): conv2d_1, ..."): "8", or "".
        first_last = tags.get("dtype.first_last", "").split(" bits", 1)[0]
        if first_last:
            dtype += f" fl{first_last}"
        per_channel = (tags.get("per_channel") or params.get("per_channel", "?")).lower()
        machine = Hardware.from_tags(tags)
        raised = tags.get("mixed_precision.raised", "")
        network = tags.get("model", "resnet8")  # runs made before the `model` group ran ResNet8
        metric = tags.get("metric", "top1")  # runs made before the metric was configuration: top-1
        backend = tags.get("backend") or params.get("backend", "?")
        rows.append(
            {
                "run_id": run.info.run_id,
                "run_name": run.info.run_name or run.info.run_id,
                "status": run.info.status,
                "start_time": run.info.start_time or 0,
                "quantized": quantized,
                # Each run is compared with the FP32 run of its network and toolchain: another network's
                # toolchain is a "backend" of its own here (``kws:onnx``); ResNet8's keep their names.
                "backend": backend if network == "resnet8" else f"{network}:{backend}",
                "network": network,
                "classes": run_classes(tags, metrics, network),
                "dtype": dtype if quantized else "fp32",
                "activation": activation,
                "weight": weight,
                "activation_bits": bits[0] if quantized else 32,
                "weight_bits": bits[1] if quantized else 32,
                "first_last_bits": first_last,
                "calib": (tags.get("calib") or params.get("calib", "?")) if made_here else "",
                "algo": algo_label(tags, params) if made_here else "",
                "per_channel": per_channel if made_here else "",
                "reduce_range": tags.get("reduce_range", "false") if made_here else "",
                "reference": reference,
                "hardware": machine.label if machine else "not recorded",
                "int8_dot_product": machine.has_int8_dot_product if machine else None,
                "execution": tags.get("execution", "" if quantized else "native"),
                "execution_reason": tags.get("execution_reason", ""),
                "config_hash": tags.get("config_hash", ""),
                "seed": params.get("data.seed", "") if made_here else "",
                "settings": settings_key(params) if made_here else "",
                "error": tags.get("error", ""),
                "sqnr_worst_layer": tags.get("sqnr_worst_layer", ""),
                "raised": raised,
                "raised_count": len([name for name in raised.split(",") if name]),
                "base_hash": tags.get("mixed_precision.base_hash", ""),
                "budget": tags.get("mixed_precision.budget", ""),
                "layer_bits": tags.get("layer_bits", ""),
                "mcu_fits": tags.get("mcu.fits", ""),
                "cost_model": tags.get("device.cost_model", ""),
                **device_columns(tags, params),
                "metric": metric,
                "quality_target": pd.to_numeric(params.get("model.quality_target"), errors="coerce"),
                **as_accuracy(metrics, metric),
            }
        )
    frame = pd.DataFrame(rows) if rows else pd.DataFrame(columns=EMPTY_COLUMNS).astype({"quantized": bool})
    per_class = [column for column in frame.columns if column.startswith(CLASS_METRIC)]  # any network's
    for column in (*METRIC_COLUMNS, *schema.stage_names("metric"), *per_class):
        frame[column] = frame[column].astype(float) if column in frame else np.nan
    frame["config"] = _configs(frame)
    frame["label"] = _labels(frame)
    return frame


def algo_label(tags: dict[str, str], params: dict[str, str]) -> str:
    """The algorithms a run applied (``none``), ``device-aware`` after them when they learned against its
    crossbar (``device-aware on noisy chips`` when that learning drew the chip's cell effects)."""
    algo = tags.get("algo") or params.get("algo") or "none"
    if tags.get("algo.device_aware") != "true":
        return algo
    return f"{algo} device-aware" + (" on noisy chips" if tags.get("algo.device_noise") == "true" else "")


DEVICE_SETTINGS = (*(item.name for item in fields(Crossbar)), "bias_correction")
"""The device settings a device run is tagged with (``device.<setting>``) that change what it computes,
columns ``device_<setting>``: the :class:`~resnet8ptq.device.config.Crossbar` dataclass's (a new crossbar
setting needs no edit here) and the device's own model change (``bias_correction``)."""
DEVICE_DEFAULTS = {item.name: item.default for item in fields(DeviceConfig)}


def device_columns(tags: dict[str, str], params: dict[str, str] | None = None) -> dict[str, object]:
    """A run's device: ``device`` (its run-name label, ``cim-r64-adc4-gated``; empty without one), the label
    of what it computes (``device_config``) and every crossbar setting (a number or a choice; NaN: unset)."""
    kind = tags.get("device.kind", "none")
    columns: dict[str, object] = {"device": "", "device_config": ""}
    columns |= {f"device_{name}": np.nan for name in DEVICE_SETTINGS}
    columns["device_worst_layer"] = tags.get("device.worst_layer", "")
    if kind == "none":
        return columns
    settings = {name: tags[f"device.{name}"] for name in DEVICE_SETTINGS if f"device.{name}" in tags}
    typed = {name: _setting(value, name) for name, value in settings.items()}
    if kind == "cim":  # a setting a run has no tag of came later: it ran at the earlier value (identity.py)
        earlier = {name: _setting(ADDED_DEFAULTS[f"device.{name}"], name) for name in DEVICE_SETTINGS}
        typed = earlier | typed
    label = costing_label(params or {}, "components.", kind) if "device.cost_model" in tags else ""
    columns["device_config"] = DeviceConfig(kind=kind, **typed).label  # what it computes, not its cost
    columns["device"] = "-".join(part for part in (columns["device_config"], label) if part)
    columns |= {f"device_{name}": typed[name] for name in typed}
    columns |= {name: np.nan for name, value in columns.items() if value is None}
    return columns


def _setting(value: str, name: str | None = None) -> object:
    """A ``device.*`` tag's value as the config held it (``name``: the setting, whose default's type says
    how: a choice such as ``drift=none`` stays a string, a flag is a bool)."""
    default = DEVICE_DEFAULTS.get(name or "")
    if isinstance(default, bool):
        return value.lower() == "true"
    if isinstance(default, str):
        return value
    if value in ("none", "null", "None"):
        return None
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def settings_key(params: dict[str, str]) -> str:
    """What decides a run's result apart from its calibration sample (``data.seed``): runs with the same key
    differ only in the sample."""
    return config_hash({key: value for key, value in params.items() if key != "data.seed"}, {})


def _configs(frame: pd.DataFrame) -> list[str]:
    """Configuration names without the calibration sample: `onnx int8 minmax`, `onnx fp32`, ..."""
    configs = []
    for row in frame.itertuples():
        if not row.quantized:
            configs.append(f"{row.backend} fp32")
        elif row.reference:
            configs.append(f"{row.reference} {row.dtype} (published)")
        else:
            channel = " per-channel" if row.per_channel == "true" else ""
            reduced = " reduce-range" if row.reduce_range == "true" else ""
            algo = f" {row.algo}" if row.algo not in ("none", "") else ""
            raised = f" +{row.raised_count}x16-bit" if row.raised_count else ""
            raised += f" within {row.budget}" if row.budget else ""
            device = f" @{row.device}" if row.device else ""
            configs.append(f"{row.backend} {row.dtype} {row.calib}{channel}{reduced}{algo}{raised}{device}")
    return configs


def _labels(frame: pd.DataFrame) -> list[str]:
    """Short unique names: the configuration (`onnx u8s8 entropy per-channel`), with `seed N` when the runs
    have several calibration samples, and the run id where names still repeat."""
    seeds = frame.loc[frame["quantized"] & (frame["seed"] != ""), "seed"].unique() if len(frame) else []
    labels = [
        f"{config} seed {seed}" if len(seeds) > 1 and seed != "" else config
        for config, seed in zip(frame["config"], frame["seed"], strict=True)
    ]
    counts = pd.Series(labels).value_counts()
    return [
        f"{label} [{run_id[:6]}]" if counts[label] > 1 else label
        for label, run_id in zip(labels, frame["run_id"], strict=True)
    ]


def latest_per_config(frame: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Finished runs cut to the newest per configuration (FP32: per backend); and how many were cut."""
    finished = frame[frame["status"] == "FINISHED"].sort_values("start_time", ascending=False)
    key = np.where(
        finished["quantized"],
        finished["config_hash"].where(finished["config_hash"] != "", finished["label"]),
        "fp32 " + finished["backend"],
    )
    latest = finished[~pd.Series(key, index=finished.index).duplicated()]
    kept = frame[(frame["status"] != "FINISHED") | frame.index.isin(latest.index)].copy()
    kept["label"] = _labels(kept)
    return kept, len(finished) - len(latest)


def without_device(names: pd.Series) -> pd.Series:
    """Configurations' or labels' names without their device part (`` @cim-r128-adc4``): the quantized model
    they ran, which a sweep's device runs share."""
    return names.str.replace(r" @\S+$", "", regex=True)


def comparison_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Finished runs with the accuracy the report compares by (:func:`compared_accuracy`), size (KiB) and
    reduction; sorted.

    Rows: per backend, its FP32 baseline first, then the quantized configurations by that accuracy.
    """
    table = frame[frame["status"] == "FINISHED"].copy()
    baselines = table[~table["quantized"]].drop_duplicates("backend").set_index("backend")
    base_size = table["backend"].map(baselines["model_size_bytes"]).astype(float)
    fp32_size = table["fp32_size_bytes"].where(table["fp32_size_bytes"].notna(), base_size)
    for i in table.index[table["accuracy_ci_low"].isna() & table["accuracy"].notna()]:
        # runs logged before the interval was: every run evaluates the whole test set
        correct = round(table.at[i, "accuracy"] * TEST_IMAGES)
        table.loc[i, ["accuracy_ci_low", "accuracy_ci_high"]] = accuracy_interval(correct, TEST_IMAGES)
    table = compared_accuracy(table, table["backend"].map(baselines["accuracy"]).astype(float))
    table["size_kib"] = table["model_size_bytes"] / 1024
    table["size_reduction"] = np.where(table["quantized"], fp32_size / table["model_size_bytes"], 1.0)
    table = table.assign(**{column: np.nan for column in TEST_COLUMNS})  # filled by significance.paired_tests
    table["sort_accuracy"] = -table["accuracy_pct"].fillna(-1)
    table = table.sort_values(["backend", "quantized", "sort_accuracy", "label"], kind="stable")
    return table.drop(columns="sort_accuracy").reset_index(drop=True)


DEVICE_METRICS = {  # a device run's figure in place of each reference one
    "accuracy": "accuracy_device",
    "accuracy_ci_low": "accuracy_device_ci_low",
    "accuracy_ci_high": "accuracy_device_ci_high",
    "accuracy_perf_subset": "accuracy_device_perf_subset",
}


def compared_accuracy(table: pd.DataFrame, fp32_accuracy: pd.Series) -> pd.DataFrame:
    """The one place that decides which accuracy the report ranks, compares and tests by: each run's
    accuracy where it runs. A device run (``on_device``: it has ``accuracy_device``) is compared by its
    accuracy on the device, every other run by its reference accuracy.

    Adds ``on_device``, ``accuracy_pct``, ``ci_low_pct``, ``ci_high_pct``, ``perf_subset_pct`` (percent),
    ``delta_points`` (against its backend's FP32 model) and ``reference_pct`` (the reference accuracy,
    shown beside a device's); the logged metrics (``accuracy``, ...) keep their meaning."""
    table = table.copy()
    on_device = table["accuracy_device"].notna()
    compared = {name: table[name].where(~on_device, table[device]) for name, device in DEVICE_METRICS.items()}
    own_delta = table["accuracy_delta"] + compared["accuracy"] - table["accuracy"]  # needs no baseline here
    delta = own_delta.where(own_delta.notna(), compared["accuracy"] - fp32_accuracy)
    table["on_device"] = on_device
    table["accuracy_pct"] = compared["accuracy"] * 100
    table["ci_low_pct"] = compared["accuracy_ci_low"] * 100
    table["ci_high_pct"] = compared["accuracy_ci_high"] * 100
    table["perf_subset_pct"] = compared["accuracy_perf_subset"] * 100
    table["delta_points"] = np.where(table["quantized"], delta * 100, 0.0)
    table["reference_pct"] = table["accuracy"] * 100
    return table


def accuracy_name(table: pd.DataFrame) -> str:
    """What the report calls the accuracy it compares by: `accuracy on the device` when a run has one; `/ AUC`
    beside it when a network is scored by AUC (:func:`metric_note`)."""
    name = "accuracy on the device" if table["on_device"].any() else "accuracy"
    return f"{name} / AUC" if scored_by_auc(table).any() else name


def scored_by_auc(table: pd.DataFrame) -> pd.Series:
    """Which rows are runs of a model scored by AUC, whose ``accuracy*`` columns hold an AUC (a table built
    without a ``metric`` column: none)."""
    if "metric" not in table:
        return pd.Series(False, index=table.index)
    return table["metric"].fillna("top1") == "auc"


def differing_note(table: pd.DataFrame) -> str:
    """What ``predictions differ`` counts for the table's AUC networks, if any ('' without one)."""
    if not scored_by_auc(table).any():
        return ""
    return " (for a network scored by AUC: samples whose anomaly score differs by more than 1e-4, relative)"


def compared_note(table: pd.DataFrame) -> str | None:
    """The sentence that says what the accuracy is in a sweep with device runs; None without."""
    devices = int(table["on_device"].sum())
    if not devices:
        return None
    others = int((~configured(table)["on_device"]).sum())
    rest = f"; the {others} configuration(s) without a device by their reference accuracy" if others else ""
    return (
        f"Accuracy here is on the device: `accuracy_device` (the mean over noise draws) of the {devices} "
        f"device run(s){rest}. The comparison shows the reference accuracy beside it; size and throughput "
        "are the quantized model's (throughput on this CPU's runtime, not the device's)."
    )


def latest_sweep_run(client: MlflowClient, experiment_name: str) -> str:
    """The id of the most recent sweep (parent) run of the experiment."""
    experiment = client.get_experiment_by_name(experiment_name)
    if experiment is None:
        raise ReportError(f"No experiment {experiment_name!r} in MLflow store {client.tracking_uri}.")
    runs = client.search_runs(
        [experiment.experiment_id],
        where({"tags.sweep": "true"}),
        max_results=1,
        order_by=["attributes.start_time DESC"],
    )
    if not runs:
        raise ReportError(f"No sweep run in experiment {experiment_name!r} at {client.tracking_uri}.")
    return runs[0].info.run_id


def configured(table: pd.DataFrame) -> pd.DataFrame:
    """The quantized runs of configurations this tool made (not published models' runs)."""
    if "reference" not in table:
        return table[table["quantized"]]
    return table[table["quantized"] & (table["reference"].fillna("") == "")]


def int8_configurations(table: pd.DataFrame) -> pd.DataFrame:
    """The configurations with 8-bit int8 activations and weights: the kind of model MLPerf Tiny publishes."""
    own = configured(table)
    int8 = (own["activation"] == "int8") & (own["weight"] == "int8")
    return own[int8 & (own["activation_bits"] == 8) & (own["weight_bits"] == 8)]
