"""Matplotlib figures a person would rather look at than read: confusion matrix, per-class accuracy, ROC
curves, per-layer SQNR. Every run draws them, so their margins are set from what they hold (fixed class
names, the longest layer name) instead of by ``tight_layout``, which draws each figure once more to measure
it (a third of its time)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def pyplot() -> ModuleType:
    """matplotlib's pyplot on the Agg backend, imported on first use: a sweep draws its charts in the drawing
    process (:mod:`resnet8ptq.drawing`), so the sweep's own process need not import matplotlib at all."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def confusion_matrix_png(matrix: np.ndarray, class_names: Sequence[str], path: Path, title: str) -> Path:
    """Heatmap of (true, predicted) counts with the counts written in each cell."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 6.5))
    image = ax.imshow(matrix, cmap="Blues")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    ticks = np.arange(len(class_names))
    ax.set(xticks=ticks, yticks=ticks, xlabel="predicted", ylabel="true", title=title)
    ax.set_xticklabels(class_names, rotation=45, ha="right")
    ax.set_yticklabels(class_names)
    threshold = matrix.max() / 2
    for (row, col), count in np.ndenumerate(matrix):
        ax.text(
            col,
            row,
            str(count),
            ha="center",
            va="center",
            fontsize=7,
            color="white" if count > threshold else "black",
        )
    return _save(fig, path, left=0.15, right=0.9, bottom=0.15, top=0.94)


def class_accuracy_png(
    accuracy: np.ndarray,
    class_names: Sequence[str],
    path: Path,
    title: str,
    baseline: np.ndarray | None = None,
) -> Path:
    """Bar chart of per-class accuracy (%), with the FP32 baseline as markers when given."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    positions = np.arange(len(class_names))
    ax.bar(positions, accuracy * 100, color="tab:blue", label="this run")
    if baseline is not None:
        ax.scatter(positions, baseline * 100, color="black", marker="_", s=400, label="FP32", zorder=3)
        ax.legend(loc="lower right")
    for x, value in zip(positions, accuracy, strict=True):
        ax.text(x, value * 100 + 0.5, f"{value * 100:.1f}", ha="center", fontsize=8)
    ax.set_xticks(positions)
    ax.set_xticklabels(class_names, rotation=30, ha="right")
    ax.set(ylabel="accuracy (%)", ylim=(0, 105), title=title)
    return _save(fig, path, left=0.08, right=0.98, bottom=0.2, top=0.91)


def roc_curve_png(curves: dict[str, tuple[np.ndarray, np.ndarray]], path: Path, title: str) -> Path:
    """ROC curves (true against false positive rate) of anomaly scores, one per model, and chance's line."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 5))
    for (label, (fpr, tpr)), style in zip(curves.items(), ("-", "--"), strict=False):
        ax.plot(fpr, tpr, style, label=label)
    ax.plot([0, 1], [0, 1], ":", color="grey", label="chance")
    ax.set(xlabel="false positive rate", ylabel="true positive rate", xlim=(0, 1), ylim=(0, 1), title=title)
    ax.legend(loc="lower right")
    return _save(fig, path, left=0.13, right=0.96, bottom=0.11, top=0.93)


def layer_sqnr_png(
    layers: Sequence[str], kinds: Sequence[str], sqnr_db: np.ndarray, path: Path, title: str
) -> Path:
    """Horizontal bars of per-layer SQNR (dB), activations and weights in two colours, worst at the top."""
    order = np.argsort(sqnr_db)[::-1]
    colors = {"activation": "tab:orange", "weight": "tab:blue"}
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 0.28 * len(layers) + 1.5))
    positions = np.arange(len(order))
    shown = np.minimum(sqnr_db[order], 80.0)  # an exactly representable tensor would stretch the axis
    ax.barh(positions, shown, color=[colors.get(kinds[i], "gray") for i in order])
    ax.set_yticks(positions)
    ax.set_yticklabels([f"{layers[i]} ({kinds[i][0]})" for i in order], fontsize=7)
    for y, value in zip(positions, sqnr_db[order], strict=True):
        ax.text(min(value, 80.0) + 0.5, y, f"{value:.1f}", va="center", fontsize=7)
    ax.set(xlabel="SQNR vs FP32 (dB, higher is better; bars cut at 80)", title=title, xlim=(0, 90))
    handles = [plt.Rectangle((0, 0), 1, 1, color=color) for color in colors.values()]
    ax.legend(handles, list(colors), loc="upper right", fontsize=8)
    longest = max((len(label.get_text()) for label in ax.get_yticklabels()), default=0)
    label_inches = 0.3 + longest * 7 * 0.62 / 72  # 7-pt tick labels: about 0.62 em per character
    height = fig.get_figheight()
    return _save(
        fig,
        path,
        left=min(0.7, label_inches / fig.get_figwidth()),
        right=0.97,
        bottom=0.6 / height,
        top=1 - 0.45 / height,
    )


def _save(fig: Figure, path: Path, **margins: float) -> Path:
    """Set the axes' margins (figure fractions), write the PNG and close the figure."""
    fig.subplots_adjust(**margins)
    fig.savefig(path, dpi=120)
    pyplot().close(fig)
    return path


def warm_up() -> None:
    """Load what the first chart would otherwise load while a run waits: the font cache and the fonts."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(1, 1))
    ax.set_title("0")
    ax.text(0, 0, "0", fontsize=7)
    fig.canvas.draw()
    plt.close(fig)
