"""The report's sections for sweeps that vary bit widths or PTQ algorithms: the accuracy map (weight bits x
activation bits) and the algorithm table."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from resnet8ptq.drawing import draw
from resnet8ptq.report.figures import ACCURACY_MAP_PNG, accuracy_map_png
from resnet8ptq.report.runs import configured
from resnet8ptq.report.sections import Report, Table

BIT_CELL = ("weight_bits", "activation_bits")

EXECUTION_MARK = {"native": "N", "native-mismatch": "N!", "simulated": "S"}
MARK_LEGEND = "N native, N! native-mismatch, S simulated, - not run"


def accuracy_map_section(report: Report) -> list[str]:
    """Accuracy over weight bits x activation bits, per backend, dtype, granularity and algorithm, when the
    runs vary the widths: a heatmap and, per panel, a table; every panel spans every width any run had. Runs
    with layers of their own width (mixed precision) are not a cell of it."""
    table = configured(report.table)
    table = table[(table["layer_bits"] == "") & (table["raised_count"] == 0)]  # uniform widths only
    if table[["activation_bits", "weight_bits"]].drop_duplicates().shape[0] < 2:
        return []
    kind = {role: table[role].str.extract(r"^(u?int)", expand=False) for role in ("activation", "weight")}
    signedness = (kind["activation"] + "/" + kind["weight"]).rename("types")
    grid = {
        "index": pd.Index(sorted(table["weight_bits"].unique()), name="weight_bits"),
        "columns": pd.Index(sorted(table["activation_bits"].unique()), name="activation_bits"),
    }
    maps, kinds, section = {}, {}, ["## Accuracy by bit width"]
    for (backend, types, per_channel, calib, reduced, first_last, algo), group in table.groupby(
        ["backend", signedness, "per_channel", "calib", "reduce_range", "first_last_bits", "algo"], sort=True
    ):
        granularity = "per-channel" if per_channel == "true" else "per-tensor"
        title = f"{backend} {types} {calib} {granularity}" + (" reduce-range" if reduced == "true" else "")
        title += f" {algo}" if algo not in ("none", "") else ""
        title += f", first and last layers at {first_last} bits" if first_last else ""
        cells = over_seeds(group)
        maps[title] = cells["mean"].unstack().reindex(**grid)
        kinds[title] = cells["mark"].unstack().reindex(**grid)
        labels = cells["label"].unstack().reindex(**grid).fillna("-")
        headers = ["weight bits \\ activation bits", *map(str, grid["columns"])]
        rows = [[str(bits), *row] for bits, row in labels.iloc[::-1].iterrows()]
        note = seeds_note(cells)
        section += [f"**{title}** (accuracy %{note}; {MARK_LEGEND})", Table(headers, rows).markdown()]
    path = report.out_dir / ACCURACY_MAP_PNG
    drawing = draw(accuracy_map_png, maps, kinds, path)
    image = report.image(path, "accuracy by weight and activation bits", drawing)
    return [*section[:1], image, *section[1:]]


def over_seeds(runs: pd.DataFrame, keys: Sequence[str] = BIT_CELL, marks: bool = True) -> pd.DataFrame:
    """One row per cell (``keys``): the mean accuracy over the runs' calibration samples (one run per
    ``seed``), their standard deviation (ddof=1) and number, the execution mark (``marks``; with the spread,
    for the heatmap) and the table's label (``85.2 ± 0.3 S``)."""
    keys = list(keys)
    if "seed" not in runs:  # tables made before runs recorded their seed: one run per cell
        runs = runs.assign(seed="")
    cells = runs.drop_duplicates([*keys, "seed"]).groupby(keys, sort=True)
    out = pd.DataFrame(
        {
            "mean": cells["accuracy_pct"].mean(),
            "std": cells["accuracy_pct"].std(ddof=1),
            "seeds": cells.size(),
        }
    )
    out["execution"] = cells["execution"].first().map(EXECUTION_MARK).fillna("?") if marks else ""
    spread = out["std"].map(lambda std: f" ± {std:.1f}" if pd.notna(std) else "")
    out["mark"] = out["execution"] + spread.str.replace(" ± ", " ±", regex=False)
    out["label"] = [
        f"{mean:.1f}{spread_text} {execution}".rstrip()
        for mean, spread_text, execution in zip(out["mean"], spread, out["execution"], strict=True)
    ]
    return out


def seeds_note(cells: pd.DataFrame) -> str:
    """``; mean ± std over 3 seeds (`data.seed`)`` where a cell has runs of several calibration samples."""
    seeds = int(cells["seeds"].max()) if len(cells) else 0
    return f"; mean ± std over {seeds} seeds (`data.seed`)" if seeds > 1 else ""


def algorithm_section(table: pd.DataFrame) -> list[str]:
    """Accuracy of each configuration with each PTQ algorithm (`algo`), when the runs vary it."""
    quantized = configured(table)
    algos = sorted(quantized["algo"].unique(), key=lambda name: (name != "none", name))
    if len(algos) < 2:
        return []
    setting = quantized["backend"] + " " + quantized["dtype"] + " " + quantized["calib"]
    setting += np.where(quantized["per_channel"] == "true", " per-channel", " per-tensor")
    cells = over_seeds(quantized.assign(setting=setting), ["setting", "algo"], marks=False)
    labels = cells["label"].unstack().reindex(columns=algos).fillna("-")
    rows = [[name, *row] for name, row in labels.iterrows()]
    note = f"Accuracy (%{seeds_note(cells)}) of each configuration quantized after each algorithm"
    note += " (`-`: not run)."
    return ["## PTQ algorithms", note, Table(["configuration", *algos], rows).markdown()]
