"""The report's figures: per-class accuracy change heatmap, accuracy vs size and vs throughput."""

from __future__ import annotations

from itertools import cycle
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

HEATMAP_PNG = "report_class_delta.png"
SIZE_PNG = "report_accuracy_vs_size.png"
THROUGHPUT_PNG = "report_accuracy_vs_throughput.png"
ACCURACY_MAP_PNG = "report_accuracy_map.png"
LABEL_ALL_POINTS = 12  # trade-off plots name every point up to this many, else only the Pareto front
MARKERS = "osD^vP<>Xph"  # one per dtype choice, FP32 a star


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
    quantized_dtypes = sorted(set(table["dtype"]) - {"fp32"})
    markers = {"fp32": "*", **dict(zip(quantized_dtypes, cycle(MARKERS), strict=False))}
    label_all = len(table) <= LABEL_ALL_POINTS
    for row, optimal in zip(table.itertuples(), front, strict=True):
        point = (getattr(row, x), row.accuracy_pct)
        marker, size = markers[row.dtype], 170 if row.dtype == "fp32" else 60
        ax.scatter(*point, color=colors[row.backend], marker=marker, s=size, zorder=3)
        if optimal or label_all:
            color = "black" if optimal else "0.45"
            ax.annotate(row.label, point, xytext=(7, 5), textcoords="offset points", fontsize=8, color=color)
    on_front = table[front].sort_values(x)
    ax.plot(on_front[x], on_front["accuracy_pct"], "--", color="0.3", linewidth=1, zorder=2)
    ax.scatter(on_front[x], on_front["accuracy_pct"], s=330, facecolors="none", edgecolors="red", zorder=4)
    handles = [Line2D([], [], color=c, marker="o", linestyle="", label=b) for b, c in colors.items()]
    handles += [
        Line2D([], [], color="0.4", marker=markers[d], linestyle="", label=d) for d in sorted(markers)
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


def accuracy_map_png(maps: dict[str, pd.DataFrame], kinds: dict[str, pd.DataFrame], path: Path) -> Path:
    """One heatmap per panel (e.g. backend and granularity): weight bits (rows) x activation bits (columns)
    of accuracy (%), each cell annotated with its accuracy and N (native) or S (simulated); blank: not run."""
    values = [m.to_numpy(float) for m in maps.values()]
    low = min(float(np.nanmin(v)) for v in values)
    high = max(float(np.nanmax(v)) for v in values)
    columns = min(len(maps), 3)
    rows = -(-len(maps) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.6 * columns, 3.9 * rows), squeeze=False)
    for ax in axes.flat[len(maps) :]:
        ax.axis("off")
    for ax, (title, grid), matrix in zip(axes.flat, maps.items(), values, strict=False):
        ax.set_facecolor("0.92")  # configurations that did not run
        image = ax.imshow(matrix, cmap="viridis", vmin=low, vmax=high, origin="lower")
        ax.set_xticks(np.arange(grid.shape[1]), [str(c) for c in grid.columns])
        ax.set_yticks(np.arange(grid.shape[0]), [str(r) for r in grid.index])
        ax.set(xlabel="activation bits", ylabel="weight bits", title=title)
        for (row, col), value in np.ndenumerate(matrix):
            if np.isfinite(value):
                kind = kinds[title].iat[row, col]
                color = "black" if value > (low + high) / 2 else "white"
                ax.text(col, row, f"{value:.1f}\n{kind}", ha="center", va="center", fontsize=7, color=color)
    fig.colorbar(image, ax=axes.ravel().tolist(), fraction=0.03, label="accuracy (%)")
    fig.suptitle("Accuracy by bit width (N native, N! native-mismatch, S simulated; grey: not run)", y=1.03)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
