"""The report's figures: per-class accuracy change heatmap, accuracy vs size and vs throughput."""

from __future__ import annotations

import textwrap
from itertools import cycle
from pathlib import Path

import numpy as np
import pandas as pd

from resnet8ptq.plots import pyplot

HEATMAP_PNG = "report_class_delta.png"
SIZE_PNG = "report_accuracy_vs_size.png"
THROUGHPUT_PNG = "report_accuracy_vs_throughput.png"
ENERGY_PNG = "report_accuracy_vs_energy.png"
AREA_PNG = "report_accuracy_vs_area.png"
CHIP_ENERGY_PNG = "report_chip_energy.png"
ACCURACY_MAP_PNG = "report_accuracy_map.png"
LABEL_ALL_POINTS = 12  # trade-off plots name every point up to this many, else only the Pareto front
MARKERS = "osD^vP<>Xph"  # one per dtype choice, FP32 a star


def class_delta_heatmap_png(deltas: pd.DataFrame, path: Path) -> Path:
    """Classes x configurations of the change in points: diverging colours centred at 0, annotated."""
    values = deltas.to_numpy(float)
    limit = max(float(np.nanmax(np.abs(values))) if np.isfinite(values).any() else 0.0, 0.5)
    plt = pyplot()
    width, height = 0.9 * values.shape[1] + 3.0, 0.35 * values.shape[0] + 2.0  # inches: columns, classes
    fig, ax = plt.subplots(figsize=(min(max(6.0, width), 30.0), min(max(6.0, height), 30.0)))
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
    table: pd.DataFrame,
    axis: tuple[str, str],
    front: np.ndarray,
    path: Path,
    title: str,
    references: tuple[tuple[str, float], ...] = (),
) -> Path:
    """Accuracy (%) against the column ``axis[0]`` (labelled ``axis[1]``): colour = backend, marker = dtype,
    the Pareto front ringed and joined; ``references`` (label, x) drawn as dotted vertical lines, on a log
    axis (published systems far from the points)."""
    x, x_label = axis
    plt = pyplot()
    from matplotlib.lines import Line2D  # with pyplot: imported when drawing

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
        Line2D([], [], color="0.4", marker=markers[d], linestyle="", label=d)
        for d in sorted(set(table["dtype"]))
    ]  # the dtypes plotted
    handles.append(
        Line2D(
            [], [], color="0.3", marker="o", markerfacecolor="none", markeredgecolor="red", linestyle="--",
            label="Pareto front",
        )
    )  # fmt: skip
    for label, value in references:
        ax.axvline(value, color="0.5", linestyle=":", linewidth=1, zorder=1)
        ax.annotate(label, (value, 0.02), xycoords=("data", "axes fraction"), rotation=90, fontsize=7,
                    color="0.35", xytext=(-9, 0), textcoords="offset points", va="bottom")  # fmt: skip
    if references:
        ax.set_xscale("log")
    ax.legend(handles=handles, loc="best", fontsize=8)
    ax.margins(x=0.15, y=0.1)
    ax.set(xlabel=x_label, ylabel="accuracy (%)", title=title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def accuracy_map_png(
    maps: dict[str, pd.DataFrame],
    kinds: dict[str, pd.DataFrame],
    path: Path,
    axes_labels: tuple[str, str] = ("activation bits", "weight bits"),
    title: str = "Accuracy by bit width (N native, N! native-mismatch, S simulated; grey: not run)",
) -> Path:
    """One heatmap per panel (e.g. backend and granularity): weight bits (rows) x activation bits (columns)
    of accuracy (%), each cell annotated with its accuracy and N (native) or S (simulated); blank: not run.
    ``axes_labels`` (x, y) and ``title`` name other maps (the device's: ADC bits x rows)."""
    values = [m.to_numpy(float) for m in maps.values()]
    low = min(float(np.nanmin(v)) for v in values)
    high = max(float(np.nanmax(v)) for v in values)
    columns = min(len(maps), 3)
    rows = -(-len(maps) // columns)
    plt = pyplot()
    fig, axes = plt.subplots(rows, columns, figsize=(4.6 * columns, 3.9 * rows), squeeze=False)
    for ax in axes.flat[len(maps) :]:
        ax.axis("off")
    for ax, (panel, grid), matrix in zip(axes.flat, maps.items(), values, strict=False):
        ax.set_facecolor("0.92")  # configurations that did not run
        image = ax.imshow(matrix, cmap="viridis", vmin=low, vmax=high, origin="lower")
        ax.set_xticks(np.arange(grid.shape[1]), [str(c) for c in grid.columns])
        ax.set_yticks(np.arange(grid.shape[0]), [str(r) for r in grid.index])
        ax.set(xlabel=axes_labels[0], ylabel=axes_labels[1])
        ax.set_title(textwrap.fill(panel, 44), fontsize=9)  # long panel names: wrapped, not overlapping
        for (row, col), value in np.ndenumerate(matrix):
            if np.isfinite(value):
                kind = kinds[panel].iat[row, col]
                color = "black" if value > (low + high) / 2 else "white"
                ax.text(col, row, f"{value:.1f}\n{kind}", ha="center", va="center", fontsize=7, color=color)
    fig.colorbar(image, ax=axes.ravel().tolist(), fraction=0.03, label="accuracy (%)")
    fig.suptitle(title, y=1.03)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


SEARCH_PNG = "report_search.png"
MIXED_PRECISION_PNG = "report_mixed_precision.png"


def search_png(
    trials: pd.DataFrame, columns: list[str], names: list[str], front: np.ndarray, path: Path
) -> Path:
    """An Optuna search: with two or more objectives the first two against each other (x: the second), with
    one its value per trial and the best so far; every trial numbered, the Pareto front ringed (and joined),
    its trials named beside the plot. A second panel zooms on the front when far-off trials squash it."""
    y = trials[columns[0]].to_numpy(float)
    if len(columns) == 1:
        x, x_label = trials["trial"].to_numpy(float), "trial"
    else:
        x, x_label = trials[columns[1]].to_numpy(float), names[1]
    span = np.ptp(y[front]) if front.any() else 0.0
    zoom = front.any() and np.ptp(y) > 4 * max(span, 1e-9)
    plt = pyplot()
    fig, axes = plt.subplots(1, 2 if zoom else 1, figsize=(13 if zoom else 9, 5.5), squeeze=False)
    for ax in axes.flat:
        if len(columns) == 1:
            best = np.fmax.accumulate(y) if trials.attrs.get("maximize", [True])[0] else np.fmin.accumulate(y)
            ax.plot(x, best, "-", color="0.3", linewidth=1, label="best so far", zorder=2)
        else:
            order = np.argsort(x[front])
            ax.plot(x[front][order], y[front][order], "--", color="0.3", linewidth=1, zorder=2)
        ax.scatter(x, y, color="C0", s=45, zorder=3, label="trial")
        ringed = {"s": 300, "facecolors": "none", "edgecolors": "red", "zorder": 4}
        ax.scatter(x[front], y[front], label="Pareto front", **ringed)
        for xi, yi, number, optimal in zip(x, y, trials["trial"], front, strict=True):
            ax.annotate(f"#{number}", (xi, yi), xytext=(6, 4), textcoords="offset points",
                        fontsize=8 if optimal else 6, color="black" if optimal else "0.45")  # fmt: skip
        ax.set(xlabel=x_label, ylabel=names[0])
        ax.margins(x=0.1, y=0.1)
        ax.grid(alpha=0.3)
    axes[0, 0].legend(loc="best", fontsize=8)
    axes[0, 0].set_title(f"Optuna search: {len(trials)} trials, Pareto front ringed")
    if zoom:
        low, high = y[front].min(), y[front].max()
        axes[0, 1].set_ylim(low - 0.5 * max(span, 0.5), high + 0.5 * max(span, 0.5))
        axes[0, 1].set_title("the front, closer")
    named = "\n".join(f"#{row.trial}: {row.label}" for row in trials[front].itertuples())
    fig.text(0.01, -0.01, f"Pareto front:\n{named}", fontsize=8, va="top", family="monospace")
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def mixed_precision_png(searches: dict[str, tuple[pd.DataFrame, float | None]], path: Path) -> Path:
    """Accuracy (%) against the number of 16-bit layers for each mixed-precision search, with the accuracy its
    target asks for (FP32 minus the target drop) dashed and the first step meeting it ringed."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for i, (title, (steps, goal)) in enumerate(searches.items()):
        color = f"C{i}"
        ax.plot(steps["raised_count"], steps["accuracy_pct"], "o-", color=color, label=title)
        if goal is not None:
            ax.axhline(goal, color=color, linestyle="--", linewidth=1)
            met = steps[steps["accuracy_pct"] >= goal - 1e-9]
            if len(met):
                first = met.iloc[0]
                ax.scatter([first["raised_count"]], [first["accuracy_pct"]], s=260, facecolors="none",
                           edgecolors="red", zorder=4)  # fmt: skip
    ax.set(xlabel="layers at 16 bits", ylabel="accuracy (%)",
           title="Mixed precision: accuracy by step (dashed: the target; ringed: the result)")  # fmt: skip
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


BUDGET_PNG = "report_budget.png"
BUDGET_MEASURES = {"bops": ("bit operations per image (millions)", 1e-6),
                   "weight_memory_bits": ("weight memory (kbit)", 1e-3)}  # fmt: skip


def budget_png(runs: pd.DataFrame, fronts: dict[str, pd.Series], path: Path) -> Path:
    """Accuracy (%) against each budget measure (one panel each): uniform widths as circles, budgeted
    mixes as triangles, one colour per backend, each backend's Pareto front (``fronts[measure]``: a mask of
    ``runs``) joined by a line."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(BUDGET_MEASURES), figsize=(12, 5))
    top = runs["accuracy_pct"].max()
    floor = max(runs["accuracy_pct"].min() - 1, top - 25)  # collapsed runs would squash the rest
    hidden = int((runs["accuracy_pct"] < floor).sum())
    for ax, (measure, (title, scale)) in zip(axes, BUDGET_MEASURES.items(), strict=True):
        for i, (backend, group) in enumerate(runs.groupby("backend", sort=True)):
            color = f"C{i}"
            for mixed, marker, kind in ((False, "o", "uniform"), (True, "^", "budgeted mix")):
                shown = group[(group["budget"] != "") == mixed]
                ax.scatter(shown[measure] * scale, shown["accuracy_pct"], marker=marker, color=color,
                           label=f"{backend} {kind}", zorder=3)  # fmt: skip
            front = group[fronts[measure].loc[group.index]].sort_values(measure)
            ax.step(front[measure] * scale, front["accuracy_pct"], where="post", color=color, alpha=0.6)
        ax.set(xlabel=title, ylabel="accuracy (%)", ylim=(floor, top + 1))
        ax.grid(alpha=0.3)
        if hidden:
            ax.text(
                0.02, 0.02, f"{hidden} runs below {floor:.0f}% not shown", transform=ax.transAxes, fontsize=8
            )
    axes[0].legend(loc="lower right", fontsize=8)
    fig.suptitle("Accuracy vs budget: uniform widths and budgeted mixes (lines: each backend's Pareto front)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


DEVICE_NOISE_PNG = "report_device_noise.png"


TIME_TICKS = {
    0: "0",
    60: "1 min",
    3600: "1 h",
    86_400: "1 day",
    2_592_000: "30 days",
    31_536_000: "1 yr",
    315_360_000: "10 yr",
}
"""Where a time axis (seconds) is labelled, in words."""


def device_curve_png(
    curves: dict[str, pd.DataFrame], lines: dict[str, float], path: Path, axis: str, log: bool
) -> Path:
    """Accuracy on the device (%) against an effect's setting (``axis``; ``log``: a symmetric-log axis, for
    time since programming, where 0 is the first read), one curve per configuration with its 95% interval
    over the noise draws as error bars (over several calibration seeds: from the lowest to the highest
    run's); horizontal lines for the reference accuracies (FP32, the quantized model's reference, the ideal
    integer device)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for label, curve in curves.items():
        error = [curve["accuracy"] - curve["low"], curve["high"] - curve["accuracy"]]
        ax.errorbar(curve["x"], curve["accuracy"], yerr=error, marker="o", capsize=3, label=label)
    for (name, value), style in zip(lines.items(), ("--", ":", "-."), strict=False):
        ax.axhline(value, linestyle=style, color="0.4", linewidth=1, label=f"{name} {value:.2f}")
    if log:
        ax.set_xscale("symlog", linthresh=1.0)
        largest = max(float(curve["x"].max()) for curve in curves.values())
        ticks = {k: v for k, v in TIME_TICKS.items() if k <= 1.5 * largest}
        ax.set_xticks(list(ticks), list(ticks.values()))
        ax.set_xlim(left=0, right=1.5 * largest)
    ax.set(xlabel=axis, ylabel="accuracy on the device (%)")
    ax.set_title(f"Accuracy vs {axis.split(' (')[0]} (mean over draws and seeds, 95% intervals)")
    ax.legend(fontsize=7)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def chip_energy_png(table: pd.DataFrame, components: tuple[str, ...], path: Path, title: str) -> Path:
    """Each chip's energy per inference as stacked horizontal bars, one segment per component (µJ)."""
    plt = pyplot()
    chips = table.sort_values("device_energy_uj")
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.38 * len(chips)))
    left = np.zeros(len(chips))
    for i, name in enumerate(components):
        values = chips[f"device_energy_uj_{name}"].fillna(0).to_numpy()
        if values.any():
            ax.barh(chips["label"], values, left=left, color=f"C{i % 10}", label=name.replace("_", " "))
            left += values
    ax.set(xlabel="energy per inference (µJ)", title=title)
    ax.invert_yaxis()
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
