"""Comparison report of a sweep's runs (or a whole experiment's), read back from MLflow.

`python -m resnet8ptq.report [--sweep RUN_ID | --experiment NAME] [--tracking-uri URI] [--out DIR]
[--max-drop POINTS]` writes report.md, a self-contained report.html and the PNGs they show (per-class
accuracy change, accuracy vs size and vs throughput with the Pareto front) and logs them to the sweep's
parent run under `report/`. `SweepRunCallback` calls `write_report` at the end of every invocation.
"""

from __future__ import annotations

import argparse
import base64
import html
import logging
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import mlflow
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from resnet8ptq.data import CLASS_NAMES
from resnet8ptq.execution import NATIVE_MISMATCH, mismatch_cause
from resnet8ptq.hardware import Hardware

log = logging.getLogger(__name__)

DEFAULT_EXPERIMENT = "resnet8ptq"
DEFAULT_MAX_DROP_POINTS = 5.0
EXIT_NOTHING_TO_REPORT = 3
ARTIFACT_DIR = "report"
HEATMAP_PNG = "report_class_delta.png"
SIZE_PNG = "report_accuracy_vs_size.png"
THROUGHPUT_PNG = "report_accuracy_vs_throughput.png"
CLASS_METRIC = "class_acc/"
DTYPE_CHOICES = {("int8", "int8"): "int8", ("uint8", "uint8"): "uint8", ("uint8", "int8"): "u8s8"}
DTYPE_MARKERS = {"fp32": "*", "int8": "o", "uint8": "s", "u8s8": "^"}
SIZE_TOLERANCE = 0.01  # model sizes within 1% count as equal when picking the smallest
THROUGHPUT_TOLERANCE = 0.05  # throughputs within 5% (timing noise) count as equal when picking the fastest
LABEL_ALL_POINTS = 12  # trade-off plots name every point up to this many, else only the Pareto front
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
    "calib",
    "per_channel",
    "reduce_range",
    "execution",
    "execution_reason",
    "hardware",
    "int8_dot_product",
    "config_hash",
    "error",
    "sqnr_worst_layer",
]  # fmt: skip  (the columns runs_frame gives every run)
METRIC_COLUMNS = (
    "accuracy",
    "accuracy_delta",
    "accuracy_native",
    "kernel_gap_points",
    "model_size_bytes",
    "fp32_size_bytes",
    "throughput_img_s",
    "latency_ms_b1",
    "sqnr_activation_min_db",
    "sqnr_weight_min_db",
    *(f"{CLASS_METRIC}{name}" for name in CLASS_NAMES),
)


class ReportError(RuntimeError):
    """The runs to report on cannot be found."""


# --------------------------------------------------------------------------------------------- runs -> table


def runs_frame(runs: Iterable[Run]) -> pd.DataFrame:
    """One row per (non-sweep) run: identity, status, settings and metrics (accuracy as a fraction)."""
    rows = []
    for run in runs:
        tags, params, metrics = run.data.tags, run.data.params, run.data.metrics
        if tags.get("sweep") == "true":
            continue
        quantized = tags.get("quantized") != "false"
        activation = tags.get("dtype.activation") or params.get("dtype.activation", "?")
        weight = tags.get("dtype.weight") or params.get("dtype.weight", "?")
        dtype = params.get("dtype") or DTYPE_CHOICES.get((activation, weight), f"{activation}/{weight}")
        per_channel = (tags.get("per_channel") or params.get("per_channel", "?")).lower()
        machine = Hardware.from_tags(tags)
        rows.append(
            {
                "run_id": run.info.run_id,
                "run_name": run.info.run_name or run.info.run_id,
                "status": run.info.status,
                "start_time": run.info.start_time or 0,
                "quantized": quantized,
                "backend": tags.get("backend") or params.get("backend", "?"),
                "dtype": dtype if quantized else "fp32",
                "activation": activation,
                "weight": weight,
                "calib": (tags.get("calib") or params.get("calib", "?")) if quantized else "",
                "per_channel": per_channel if quantized else "",
                "reduce_range": tags.get("reduce_range", "false") if quantized else "",
                "hardware": machine.label if machine else "not recorded",
                "int8_dot_product": machine.has_int8_dot_product if machine else None,
                "execution": tags.get("execution", "" if quantized else "native"),
                "execution_reason": tags.get("execution_reason", ""),
                "config_hash": tags.get("config_hash", ""),
                "error": tags.get("error", ""),
                "sqnr_worst_layer": tags.get("sqnr_worst_layer", ""),
                **metrics,
            }
        )
    frame = pd.DataFrame(rows) if rows else pd.DataFrame(columns=EMPTY_COLUMNS).astype({"quantized": bool})
    for column in METRIC_COLUMNS:
        frame[column] = frame[column].astype(float) if column in frame else np.nan
    frame["label"] = _labels(frame)
    return frame


def _labels(frame: pd.DataFrame) -> list[str]:
    """Short unique configuration names: `onnx int8 minmax`, `onnx u8s8 entropy per-channel`, `onnx fp32`."""
    labels = []
    for row in frame.itertuples():
        if not row.quantized:
            labels.append(f"{row.backend} fp32")
        else:
            channel = " per-channel" if row.per_channel == "true" else ""
            reduced = " reduce-range" if row.reduce_range == "true" else ""
            labels.append(f"{row.backend} {row.dtype} {row.calib}{channel}{reduced}")
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


def comparison_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Finished runs with accuracy (%), change vs FP32 (points), size (KiB) and reduction; sorted.

    Rows: per backend, its FP32 baseline first, then the quantized configurations by accuracy.
    """
    table = frame[frame["status"] == "FINISHED"].copy()
    baselines = table[~table["quantized"]].drop_duplicates("backend").set_index("backend")
    base_accuracy = table["backend"].map(baselines["accuracy"]).astype(float)
    base_size = table["backend"].map(baselines["model_size_bytes"]).astype(float)
    delta = table["accuracy_delta"].where(table["accuracy_delta"].notna(), table["accuracy"] - base_accuracy)
    fp32_size = table["fp32_size_bytes"].where(table["fp32_size_bytes"].notna(), base_size)
    table["accuracy_pct"] = table["accuracy"] * 100
    table["delta_points"] = np.where(table["quantized"], delta * 100, 0.0)
    table["size_kib"] = table["model_size_bytes"] / 1024
    table["size_reduction"] = np.where(table["quantized"], fp32_size / table["model_size_bytes"], 1.0)
    table["sort_accuracy"] = -table["accuracy"].fillna(-1)
    table = table.sort_values(["backend", "quantized", "sort_accuracy", "label"], kind="stable")
    return table.drop(columns="sort_accuracy").reset_index(drop=True)


# ----------------------------------------------------------------------------------------- analysis


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    """Format a number, `n/a` when it is missing."""
    return "n/a" if value is None or not np.isfinite(value) else f"{value:{spec}}{suffix}"


@dataclass(frozen=True)
class Pick:
    """A recommended configuration and why."""

    what: str
    label: str
    run_id: str
    detail: str


def _pick(
    candidates: pd.DataFrame, what: str, by: str, *, smaller_is_better: bool, tolerance: float = 0.0
) -> Pick | None:
    """The best candidate by `by`; values within `tolerance` (rel.) of the best tie: most accurate wins."""
    values = candidates[by].dropna()
    if values.empty:
        return None
    best = values.min() if smaller_is_better else values.max()
    close = values <= best * (1 + tolerance) if smaller_is_better else values >= best * (1 - tolerance)
    ranked = candidates.loc[close[close].index].sort_values(
        ["accuracy", by, "label"], ascending=[False, smaller_is_better, True], kind="stable"
    )
    row = ranked.iloc[0]
    return Pick(what, row["label"], row["run_id"], describe(row))


def describe(row: pd.Series) -> str:
    """`86.73% (-0.46 points vs FP32), 108.0 KiB (2.90x smaller), 2668 img/s, 0.094 ms at batch 1`."""
    return (
        f"{_fmt(row['accuracy_pct'], '.2f', '%')} ({_fmt(row['delta_points'], '+.2f')} points vs FP32), "
        f"{_fmt(row['size_kib'], '.1f')} KiB ({_fmt(row['size_reduction'], '.2f', 'x')} smaller), "
        f"{_fmt(row['throughput_img_s'], '.0f')} img/s, {_fmt(row['latency_ms_b1'], '.3f')} ms at batch 1"
    )


def recommendations(table: pd.DataFrame, max_drop_points: float) -> tuple[list[Pick], pd.DataFrame]:
    """Best accuracy, smallest, fastest, best per backend (quantized runs); and the runs over the drop limit.

    Smallest and fastest consider the configurations within the limit (all when none is); sizes within
    SIZE_TOLERANCE and throughputs within THROUGHPUT_TOLERANCE count as ties, won by the most accurate.
    """
    quantized = table[table["quantized"]]
    over = quantized[quantized["delta_points"] < -max_drop_points].sort_values("delta_points")
    pool = quantized.drop(over.index) if len(over) < len(quantized) else quantized
    picks = [
        _pick(quantized, "Best accuracy", "accuracy", smaller_is_better=False),
        _pick(pool, "Smallest model", "model_size_bytes", smaller_is_better=True, tolerance=SIZE_TOLERANCE),
        *_fastest_per_machine(table, pool),
        *(
            _pick(group, f"Best {backend}", "accuracy", smaller_is_better=False)
            for backend, group in quantized.groupby("backend", sort=True)
        ),
    ]
    return [pick for pick in picks if pick is not None], over


def _fastest_per_machine(table: pd.DataFrame, pool: pd.DataFrame) -> list[Pick | None]:
    """The fastest configuration on each machine (speed compares only within one), noting when it is
    slower than its backend's FP32 model on that machine."""
    machines = sorted(pool["hardware"].unique())
    picks: list[Pick | None] = []
    for machine in machines:
        what = "Fastest" if len(machines) == 1 else f"Fastest on {machine}"
        pick = _pick(
            pool[pool["hardware"] == machine],
            what,
            "throughput_img_s",
            smaller_is_better=False,
            tolerance=THROUGHPUT_TOLERANCE,
        )
        if pick is not None:
            row = table[table["run_id"] == pick.run_id].iloc[0]
            same = ~table["quantized"] & (table["backend"] == row["backend"]) & (table["hardware"] == machine)
            fp32 = table[same]["throughput_img_s"].dropna()
            if len(fp32) and fp32.iloc[0] > row["throughput_img_s"]:
                note = f"; slower than {row['backend']} FP32 ({fp32.iloc[0]:.0f} img/s)"
                pick = Pick(pick.what, pick.label, pick.run_id, pick.detail + note)
        picks.append(pick)
    return picks


def class_deltas(table: pd.DataFrame) -> pd.DataFrame:
    """Per-class accuracy change vs the FP32 baseline of the same backend, in points (classes x configs)."""
    columns = [f"{CLASS_METRIC}{name}" for name in CLASS_NAMES]
    baselines = table[~table["quantized"]].drop_duplicates("backend").set_index("backend")[columns]
    deltas = {
        row["label"]: (row[columns].to_numpy(float) - baselines.loc[row["backend"]].to_numpy(float)) * 100
        for _, row in table[table["quantized"]].iterrows()
        if row["backend"] in baselines.index
    }
    return pd.DataFrame(deltas, index=list(CLASS_NAMES), dtype=float)


def worst_classes(deltas: pd.DataFrame, limit: int = 5) -> pd.DataFrame:
    """The classes that lose the most: each class's worst change (points), under which config, the mean."""
    if deltas.empty:
        return pd.DataFrame(columns=["class", "worst_points", "config", "mean_points"])
    worst = pd.DataFrame(
        {
            "class": deltas.index,
            "worst_points": deltas.min(axis=1).to_numpy(),
            "config": deltas.idxmin(axis=1).to_numpy(),
            "mean_points": deltas.mean(axis=1).to_numpy(),
        }
    ).dropna(subset=["worst_points"])
    worst = worst[worst["worst_points"] < 0].sort_values("worst_points", kind="stable")
    return worst.head(limit).reset_index(drop=True)


def pareto_front(x: np.ndarray, accuracy: np.ndarray, *, minimize_x: bool) -> np.ndarray:
    """Mask of the points that no other point dominates (accuracy at least as high and x at least as good,
    one of them strictly better); accuracy is maximised, x minimised or maximised."""
    x = np.asarray(x, float) * (1 if minimize_x else -1)
    accuracy = np.asarray(accuracy, float)
    at_least = (x[None, :] <= x[:, None]) & (accuracy[None, :] >= accuracy[:, None])
    strictly = (x[None, :] < x[:, None]) | (accuracy[None, :] > accuracy[:, None])
    return ~(at_least & strictly).any(axis=1)


# -------------------------------------------------------------------------------------------- plots


def class_delta_heatmap_png(deltas: pd.DataFrame, path: Path) -> Path:
    """Classes x configurations of the change in points: diverging colours centred at 0, annotated."""
    values = deltas.to_numpy(float)
    limit = max(float(np.nanmax(np.abs(values))) if np.isfinite(values).any() else 0.0, 0.5)
    fig, ax = plt.subplots(figsize=(min(max(6.0, 0.9 * values.shape[1] + 3.0), 30.0), 6.0))
    image = ax.imshow(values, cmap="RdBu", vmin=-limit, vmax=limit, aspect="auto")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="change vs FP32 (points)")
    ax.set_xticks(np.arange(values.shape[1]))
    ax.set_xticklabels(deltas.columns, rotation=35, ha="right", fontsize=8)
    ax.set_yticks(np.arange(values.shape[0]))
    ax.set_yticklabels(deltas.index)
    ax.set_title("Per-class accuracy change vs FP32 of the same backend (points)")
    for (row, col), value in np.ndenumerate(values):
        if np.isfinite(value):
            color = "white" if abs(value) > 0.6 * limit else "black"
            ax.text(col, row, f"{value:+.1f}", ha="center", va="center", fontsize=7, color=color)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def tradeoff_png(
    table: pd.DataFrame, x: str, x_label: str, front: np.ndarray, path: Path, title: str
) -> Path:
    """Accuracy (%) against `x`: colour = backend, marker = dtype, the Pareto front ringed and joined."""
    fig, ax = plt.subplots(figsize=(9, 5.5))
    colors = {backend: f"C{i}" for i, backend in enumerate(sorted(table["backend"].unique()))}
    label_all = len(table) <= LABEL_ALL_POINTS
    for row, optimal in zip(table.itertuples(), front, strict=True):
        point = (getattr(row, x), row.accuracy_pct)
        marker, size = DTYPE_MARKERS.get(row.dtype, "D"), 170 if row.dtype == "fp32" else 60
        ax.scatter(*point, color=colors[row.backend], marker=marker, s=size, zorder=3)
        if optimal or label_all:
            color = "black" if optimal else "0.45"
            ax.annotate(row.label, point, xytext=(7, 5), textcoords="offset points", fontsize=8, color=color)
    on_front = table[front].sort_values(x)
    ax.plot(on_front[x], on_front["accuracy_pct"], "--", color="0.3", linewidth=1, zorder=2)
    ax.scatter(on_front[x], on_front["accuracy_pct"], s=330, facecolors="none", edgecolors="red", zorder=4)
    handles = [Line2D([], [], color=c, marker="o", linestyle="", label=b) for b, c in colors.items()]
    handles += [
        Line2D([], [], color="0.4", marker=DTYPE_MARKERS.get(d, "D"), linestyle="", label=d)
        for d in sorted(table["dtype"].unique())
    ]
    handles.append(
        Line2D(
            [], [], color="0.3", marker="o", markerfacecolor="none", markeredgecolor="red", linestyle="--",
            label="Pareto front",
        )
    )  # fmt: skip
    ax.legend(handles=handles, loc="best", fontsize=8)
    ax.margins(x=0.15, y=0.1)
    ax.set(xlabel=x_label, ylabel="accuracy (%)", title=title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------- document (md + html)


@dataclass(frozen=True)
class Table:
    """A table to render; `classes` gives each row a CSS class in HTML (`fp32`, `over`, `failed`)."""

    headers: list[str]
    rows: list[list[str]]
    classes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Image:
    """A PNG beside the report."""

    path: Path
    alt: str


Block = tuple[str, str] | Table | Image | list[str]  # ("h1"|"h2"|"p", text), table, image, bullet list


def comparison_rows(table: pd.DataFrame, max_drop_points: float) -> Table:
    """The comparison table, one row per finished run."""
    headers = [
        "configuration",
        "backend",
        "dtype",
        "act/weight",
        "calib",
        "per-channel",
        "accuracy (%)",
        "Δ vs FP32 (points)",
        "size (KiB)",
        "size reduction",
        "throughput (img/s)",
        "latency b1 (ms)",
        "execution",
        "native (%)",
        "kernel gap (points)",
    ]
    machines = _machine_names(table)
    headers += ["machine"] if len(machines) > 1 else []
    headers.append("run")
    rows, classes = [], []
    for row in table.itertuples():
        over = row.quantized and row.delta_points < -max_drop_points
        rows.append(
            [
                row.label,
                row.backend,
                row.dtype,
                f"{row.activation}/{row.weight}",
                row.calib or "—",
                row.per_channel or "—",
                _fmt(row.accuracy_pct, ".2f"),
                _fmt(row.delta_points, "+.2f", " ⚠" if over else ""),
                _fmt(row.size_kib, ".1f"),
                _fmt(row.size_reduction, ".2f", "x"),
                _fmt(row.throughput_img_s, ".0f"),
                _fmt(row.latency_ms_b1, ".3f"),
                row.execution or "—",
                _fmt(row.accuracy_native * 100, ".2f") if np.isfinite(row.accuracy_native) else "—",
                _fmt(row.kernel_gap_points, "+.2f") if np.isfinite(row.kernel_gap_points) else "—",
                *([machines[row.hardware]] if len(machines) > 1 else []),
                row.run_id[:8],
            ]
        )
        classes.append("over" if over else ("" if row.quantized else "fp32"))
    return Table(headers, rows, classes)


def failed_rows(failed: pd.DataFrame) -> Table:
    """Runs that did not finish, with their status and error."""
    rows = [
        [
            row.label,
            row.run_name,
            row.status,
            (row.error or "(no error recorded)")[:400],
            row.run_id[:8],
        ]
        for row in failed.sort_values(["backend", "label"]).itertuples()
    ]
    return Table(["configuration", "run name", "status", "error", "run"], rows, ["failed"] * len(rows))


@dataclass
class Report:
    """Everything a report shows, computed from the runs."""

    title: str
    context: list[str]
    table: pd.DataFrame
    failed: pd.DataFrame
    max_drop_points: float
    out_dir: Path
    images: list[Image] = field(default_factory=list)

    @property
    def has_results(self) -> bool:
        """Whether at least one quantized run finished."""
        return bool(self.table["quantized"].any()) if len(self.table) else False


def build(report: Report) -> list[Block]:
    """The report as blocks (writing its PNGs into the report's directory)."""
    table = report.table
    counts = (
        f"finished: {int(table['quantized'].sum())} quantized, {int((~table['quantized']).sum())} FP32 "
        f"baseline(s); failed or unfinished: {len(report.failed)}"
    )
    blocks: list[Block] = [("h1", report.title), [*report.context, *hardware_lines(table), counts]]
    if not report.has_results:
        blocks.append(("p", f"**{nothing_to_report_message(report)}**"))
    else:
        blocks += recommendation_blocks(table, report.max_drop_points)
    if len(table):
        blocks += [("h2", "Comparison"), comparison_rows(table, report.max_drop_points)]
        blocks += execution_blocks(table)
    if report.has_results:
        blocks += per_class_blocks(report) + layer_error_blocks(report.table) + tradeoff_blocks(report)
    blocks.append(("h2", f"Failed runs ({len(report.failed)})"))
    blocks.append(failed_rows(report.failed) if len(report.failed) else ("p", "None: every run finished."))
    return blocks


def nothing_to_report_message(report: Report) -> str:
    """Why there is no comparison."""
    return (
        f"Nothing to report: no finished quantized run ({len(report.failed)} failed or unfinished, "
        f"{int((~report.table['quantized']).sum())} FP32 baseline(s) finished)."
    )


def recommendation_blocks(table: pd.DataFrame, limit: float) -> list[Block]:
    """The picks as bullets, then the configurations over the accuracy-drop limit."""
    picks, over = recommendations(table, limit)
    bullets = [f"**{pick.what}**: {pick.label} — {pick.detail}" for pick in picks]
    over_text = ", ".join(f"{r.label} ({r.delta_points:+.2f} points)" for r in over.itertuples())
    bullets.append(f"**Accuracy drop over {limit:g} points**: {over_text or 'none'}")
    scope = (
        f"among the configurations within the {limit:g}-point limit"
        if len(over) < int(table["quantized"].sum())
        else f"among all configurations (none is within the {limit:g}-point limit)"
    )
    note = (
        f"Smallest and fastest are chosen {scope}; sizes within {SIZE_TOLERANCE:.0%} and throughputs within "
        f"{THROUGHPUT_TOLERANCE:.0%} count as ties, won by the more accurate."
    )
    return [("h2", "Recommendations"), bullets, ("p", note)]


def _machine_names(table: pd.DataFrame) -> dict[str, str]:
    """Short names (M1, M2, ...) for the machines the runs were measured on, by hardware label."""
    return {label: f"M{i}" for i, label in enumerate(sorted(table["hardware"].unique()), 1)}


def hardware_lines(table: pd.DataFrame) -> list[str]:
    """The report header's hardware: the one machine, or each machine and a warning that speed and native
    accuracy compare only within one machine."""
    machines = _machine_names(table)
    if len(machines) <= 1:
        return [f"hardware: {label}" for label in machines]
    listed = "; ".join(f"{short} = {label}" for label, short in machines.items())
    return [
        f"**runs from {len(machines)} machines** ({listed}): accuracy (the reference semantics) compares "
        f"across them; speed and native accuracy only within one machine (column `machine`)"
    ]


def execution_blocks(table: pd.DataFrame) -> list[Block]:
    """Reference vs native accuracy of the runs whose integer kernels ran, with the cause of each mismatch,
    then how the other configurations executed."""
    quantized = table[table["quantized"] & (table["execution"].fillna("") != "")].fillna(
        {"execution_reason": ""}
    )
    if quantized.empty:
        return []
    blocks: list[Block] = [("h2", "Reference and native execution")]
    blocks.append(
        (
            "p",
            "`accuracy` is the reference semantics (the quantized model's exact quantize/dequantize "
            "arithmetic, the same on every CPU). Where the runtime runs integer kernels, their accuracy on "
            "this CPU is measured too: `native` when it matches the reference within the tolerance, "
            "`native-mismatch` when it does not.",
        )
    )
    kernels = quantized[quantized["kernel_gap_points"].notna()]
    machines = _machine_names(table)
    if len(kernels):
        rows = [
            [
                r.label,
                machines[r.hardware] if len(machines) > 1 else r.hardware,
                f"{r.accuracy * 100:.2f}",
                f"{r.accuracy_native * 100:.2f}",
                f"{r.kernel_gap_points:+.2f}",
                r.execution,
            ]
            for r in kernels.sort_values(["hardware", "label"]).itertuples()
        ]
        headers = ["configuration", "machine", "reference (%)", "native (%)", "gap (points)", "execution"]
        blocks.append(Table(headers, rows))
    causes = {}
    for r in quantized[quantized["execution"] == NATIVE_MISMATCH].itertuples():
        if r.int8_dot_product is None:
            cause = "the machine was not recorded"
        else:
            cause = mismatch_cause(bool(r.int8_dot_product), (r.activation, r.weight))
        causes.setdefault(cause, []).append(r.label)
    if causes:
        blocks.append(
            [f"**native-mismatch** ({', '.join(labels)}): {cause}" for cause, labels in causes.items()]
        )
    simulated = quantized[quantized["kernel_gap_points"].isna()]
    notes = [
        f"**{execution}** ({reason or 'no reason recorded'}): {', '.join(group['label'])}"
        for (execution, reason), group in simulated.groupby(["execution", "execution_reason"], sort=True)
    ]
    return blocks + ([notes] if notes else [])


def per_class_blocks(report: Report) -> list[Block]:
    """The classes that lose the most, and the heatmap of every class under every configuration."""
    deltas = class_deltas(report.table)
    if deltas.empty:
        return []
    blocks: list[Block] = [("h2", "Per-class accuracy")]
    worst = worst_classes(deltas)
    if len(worst):
        top = worst.iloc[0]
        blocks.append(
            (
                "p",
                f"Most affected: **{top['class']} {top['worst_points']:+.1f} points under {top['config']}**.",
            )
        )
        rows = [
            [r["class"], f"{r['worst_points']:+.1f}", r["config"], f"{r['mean_points']:+.2f}"]
            for r in worst.to_dict("records")
        ]
        blocks.append(Table(["class", "worst Δ (points)", "under", "mean Δ over configs (points)"], rows))
    else:
        blocks.append(("p", "No class loses accuracy under any configuration."))
    heatmap = class_delta_heatmap_png(deltas, report.out_dir / HEATMAP_PNG)
    blocks.append(_image(report, heatmap, "per-class accuracy change vs FP32"))
    return blocks


def layer_error_blocks(table: pd.DataFrame) -> list[Block]:
    """The worst layer of each configuration (per-layer SQNR against FP32; every layer in analysis/)."""
    quantized = table[table["quantized"] & (table["sqnr_worst_layer"].fillna("") != "")]
    if quantized.empty:
        return []
    quantized = quantized.sort_values("sqnr_activation_min_db", na_position="last")
    rows = [
        [r.label, f"{r.sqnr_activation_min_db:.1f}", f"{r.sqnr_weight_min_db:.1f}", r.sqnr_worst_layer]
        for r in quantized.itertuples()
    ]
    note = (
        "Signal-to-quantization-noise ratio of each layer against the FP32 model on calibration images "
        "(higher is better; every 6 dB is one bit). Each run's `analysis/layer_sqnr.csv` and "
        "`layer_sqnr.png` list every layer."
    )
    header = ["configuration", "min activation SQNR (dB)", "min weight SQNR (dB)", "worst layer"]
    return [("h2", "Per-layer error (worst layers)"), ("p", note), Table(header, rows)]


def tradeoff_blocks(report: Report) -> list[Block]:
    """Accuracy vs size and vs throughput, with the Pareto-optimal configurations named."""
    blocks: list[Block] = [("h2", "Trade-offs")]
    machines = _machine_names(report.table)
    panels = [("size_kib", "model size (KiB)", True, SIZE_PNG, "accuracy vs model size", report.table)]
    for label, short in machines.items():  # speed compares only within one machine
        png = THROUGHPUT_PNG if len(machines) == 1 else THROUGHPUT_PNG.replace(".png", f"_{short}.png")
        what = "accuracy vs throughput" + (f" on {short} ({label})" if len(machines) > 1 else "")
        rows = report.table[report.table["hardware"] == label]
        panels.append(("throughput_img_s", "throughput (img/s)", False, png, what, rows))
    for x, x_label, minimize, png, what, rows in panels:
        points = rows.dropna(subset=[x, "accuracy_pct"]).reset_index(drop=True)
        if points.empty:
            continue
        front = pareto_front(points[x].to_numpy(), points["accuracy_pct"].to_numpy(), minimize_x=minimize)
        blocks.append(("p", f"Pareto front, {what}: **" + ", ".join(points.loc[front, "label"]) + "**."))
        title = f"{what.capitalize()} (Pareto front ringed)"
        path = tradeoff_png(points, x, x_label, front, report.out_dir / png, title)
        blocks.append(_image(report, path, what))
    return blocks


def _image(report: Report, path: Path, alt: str) -> Image:
    image = Image(path, alt)
    report.images.append(image)
    return image


def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def to_markdown(blocks: Sequence[Block]) -> str:
    """Markdown with the images referenced by file name (they sit beside report.md)."""
    out = []
    for block in blocks:
        if isinstance(block, Table):
            out.append("| " + " | ".join(block.headers) + " |")
            out.append("|" + "---|" * len(block.headers))
            out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in block.rows]
        elif isinstance(block, Image):
            out.append(f"![{block.alt}]({block.path.name})")
        elif isinstance(block, list):
            out += [f"- {item}" for item in block]
        else:
            kind, text = block
            out.append({"h1": "# ", "h2": "## ", "p": ""}[kind] + text)
        out.append("")
    return "\n".join(out)


def _inline_html(text: str) -> str:
    """Escape, then turn `**bold**` into <strong>."""
    parts = html.escape(text).split("**")
    return "".join(f"<strong>{p}</strong>" if i % 2 else p for i, p in enumerate(parts))


CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:2em auto;max-width:1400px;color:#222;
padding:0 1em}table{border-collapse:collapse;margin:1em 0;font-size:14px}
th,td{border:1px solid #ccc;padding:4px 8px;text-align:left}th{background:#f0f0f0}
tr:nth-child(even){background:#fafafa}tr.fp32{background:#eef4fb;font-style:italic}tr.over{background:#fde8e8}
tr.failed{background:#fde8e8}td:first-child{white-space:nowrap}
img{max-width:100%;border:1px solid #ddd;margin:0.5em 0}
h2{border-bottom:1px solid #ddd;padding-bottom:0.2em;margin-top:1.5em}
"""


def to_html(blocks: Sequence[Block], title: str) -> str:
    """A self-contained HTML page: inline CSS, images embedded as base64 data URIs."""
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>",
    ]
    for block in blocks:
        if isinstance(block, Table):
            out.append("<table><thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in block.headers))
            out.append("</tr></thead><tbody>")
            classes = block.classes or [""] * len(block.rows)
            for row, css in zip(block.rows, classes, strict=True):
                attr = f' class="{css}"' if css else ""
                out.append(f"<tr{attr}>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>")
            out.append("</tbody></table>")
        elif isinstance(block, Image):
            data = base64.b64encode(block.path.read_bytes()).decode("ascii")
            out.append(f'<p><img alt="{html.escape(block.alt)}" src="data:image/png;base64,{data}"></p>')
        elif isinstance(block, list):
            out.append("<ul>" + "".join(f"<li>{_inline_html(item)}</li>" for item in block) + "</ul>")
        else:
            kind, text = block
            out.append(f"<{kind}>{_inline_html(text)}</{kind}>")
    out.append("</body></html>")
    return "\n".join(out)


# --------------------------------------------------------------------------------------- entry points


def _search_all(client: MlflowClient, experiment_ids: list[str], filter_string: str = "") -> list[Run]:
    """Every run matching the filter (all pages)."""
    runs, token = [], None
    while True:
        page = client.search_runs(experiment_ids, filter_string, max_results=1000, page_token=token)
        runs += list(page)
        token = page.token
        if not token:
            return runs


def latest_sweep_run(client: MlflowClient, experiment_name: str = DEFAULT_EXPERIMENT) -> str:
    """The id of the most recent sweep (parent) run of the experiment."""
    experiment = client.get_experiment_by_name(experiment_name)
    if experiment is None:
        raise ReportError(f"No experiment {experiment_name!r} in MLflow store {client.tracking_uri}.")
    runs = client.search_runs(
        [experiment.experiment_id],
        "tags.sweep = 'true'",
        max_results=1,
        order_by=["attributes.start_time DESC"],
    )
    if not runs:
        raise ReportError(f"No sweep run in experiment {experiment_name!r} at {client.tracking_uri}.")
    return runs[0].info.run_id


def _finish(report: Report, client: MlflowClient, parent_run_id: str | None) -> Path | None:
    """Write report.md, report.html and PNGs, log them to the parent run; report.html, None if empty."""
    report.out_dir.mkdir(parents=True, exist_ok=True)
    blocks = build(report)
    md_path, html_path = report.out_dir / "report.md", report.out_dir / "report.html"
    md_path.write_text(to_markdown(blocks), encoding="utf-8")
    html_path.write_text(to_html(blocks, report.title), encoding="utf-8")
    if parent_run_id is not None:
        for path in (md_path, html_path, *(image.path for image in report.images)):
            client.log_artifact(parent_run_id, str(path), ARTIFACT_DIR)
    if not report.has_results:
        log.warning("%s Report saying so: %s", nothing_to_report_message(report), md_path)
        return None
    log.info("Comparison report: %s", html_path)
    return html_path


def _context(run_count: int, superseded: int, extra: Sequence[str]) -> list[str]:
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [*extra, f"runs read: {run_count}", f"generated: {now}"]
    if superseded:
        lines.append(f"older reruns of the same configuration not shown: {superseded}")
    return lines


def write_report(
    parent_run_id: str,
    out_dir: Path | None = None,
    max_drop_points: float = DEFAULT_MAX_DROP_POINTS,
    tracking_uri: str | None = None,
) -> Path | None:
    """Report on the children of a sweep (parent) run, into `out_dir` (default: its `sweep_dir` tag).

    Returns report.html, or None when no quantized run finished (the report then says so).
    """
    client = MlflowClient(tracking_uri)
    parent = client.get_run(parent_run_id)
    children = _search_all(
        client, [parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent_run_id}'"
    )
    frame = runs_frame(children)
    tags = parent.data.tags
    default_dir = (
        Path(tags["sweep_dir"]) if tags.get("sweep_dir") else Path("runs") / f"report-{parent_run_id}"
    )
    context = [
        f"parent run: {parent.info.run_name} ({parent_run_id}), status {parent.info.status}",
        f"overrides: {tags.get('overrides', '?')}",
        f"sweep dir: {tags.get('sweep_dir', '?')}",
        f"accuracy-drop limit: {max_drop_points:g} points",
    ]
    report = Report(
        title=f"Quantization report: {parent.info.run_name}",
        context=_context(len(frame), 0, context),
        table=comparison_table(frame),
        failed=frame[frame["status"] != "FINISHED"],
        max_drop_points=max_drop_points,
        out_dir=Path(out_dir or default_dir),
    )
    return _finish(report, client, parent_run_id)


def write_experiment_report(
    experiment_name: str,
    out_dir: Path | None = None,
    max_drop_points: float = DEFAULT_MAX_DROP_POINTS,
    tracking_uri: str | None = None,
) -> Path | None:
    """Report on every run of an experiment (newest run per configuration) into `out_dir`
    (default: runs/report-<experiment>). Returns report.html, or None when nothing finished."""
    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name(experiment_name)
    if experiment is None:
        raise ReportError(f"No experiment {experiment_name!r} in MLflow store {client.tracking_uri}.")
    frame = runs_frame(_search_all(client, [experiment.experiment_id]))
    latest, superseded = latest_per_config(frame)
    report = Report(
        title=f"Quantization report: experiment {experiment_name}",
        context=_context(
            len(frame),
            superseded,
            [f"accuracy-drop limit: {max_drop_points:g} points", f"experiment: {experiment_name}"],
        ),
        table=comparison_table(latest),
        failed=latest[latest["status"] != "FINISHED"],
        max_drop_points=max_drop_points,
        out_dir=Path(out_dir or Path("runs") / f"report-{experiment_name}"),
    )
    return _finish(report, client, None)


def _check_store(uri: str) -> None:
    """A local sqlite store must exist already (MLflow would silently create an empty one)."""
    if uri.startswith("sqlite:///"):
        path = Path(uri.removeprefix("sqlite:///"))
        if not path.is_file():
            raise ReportError(
                f"No MLflow store at {path.resolve()}: run from the directory holding mlflow.db, "
                f"or pass --tracking-uri."
            )


def main(argv: Sequence[str] | None = None) -> int:
    """CLI; exit 0 = report written, 3 = nothing to report, 2 = no such sweep/experiment/store."""
    parser = argparse.ArgumentParser(
        prog="python -m resnet8ptq.report",
        description="Comparison report (Markdown + self-contained HTML + PNGs) of a sweep's MLflow runs.",
    )
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "--sweep",
        metavar="RUN_ID",
        help=f"parent run of the sweep (default: the most recent in experiment {DEFAULT_EXPERIMENT})",
    )
    scope.add_argument("--experiment", metavar="NAME", help="report on every run of this experiment instead")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default: MLflow's, sqlite:///mlflow.db)")
    parser.add_argument("--out", type=Path, help="output directory (default: the sweep's runs/ directory)")
    parser.add_argument(
        "--max-drop",
        type=float,
        default=DEFAULT_MAX_DROP_POINTS,
        metavar="POINTS",
        help="flag configurations losing more accuracy than this vs FP32 (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    uri = args.tracking_uri or mlflow.get_tracking_uri()
    try:
        _check_store(uri)
        if args.experiment:
            path = write_experiment_report(args.experiment, args.out, args.max_drop, uri)
        else:
            sweep = args.sweep or latest_sweep_run(MlflowClient(uri))
            path = write_report(sweep, args.out, args.max_drop, uri)
    except ReportError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except mlflow.exceptions.MlflowException as err:
        print(f"error: {err.message}", file=sys.stderr)
        return 2
    return EXIT_NOTHING_TO_REPORT if path is None else 0  # _finish logged where the report is


if __name__ == "__main__":
    sys.exit(main())
