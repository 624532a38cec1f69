"""The report's sections for sweeps that vary bit widths or PTQ algorithms: the accuracy map (weight bits x
activation bits) and the algorithm table."""

from __future__ import annotations

import numpy as np
import pandas as pd

from resnet8ptq.drawing import draw
from resnet8ptq.report.figures import ACCURACY_MAP_PNG, accuracy_map_png
from resnet8ptq.report.runs import configured
from resnet8ptq.report.sections import Report, Table

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
        seeds = int(cells["seeds"].max())
        note = f"; mean ± std over {seeds} seeds (`data.seed`)" if seeds > 1 else ""
        section += [f"**{title}** (accuracy %{note}; {MARK_LEGEND})", Table(headers, rows).markdown()]
    path = report.out_dir / ACCURACY_MAP_PNG
    drawing = draw(accuracy_map_png, maps, kinds, path)
    image = report.image(path, "accuracy by weight and activation bits", drawing)
    return [*section[:1], image, *section[1:]]


def over_seeds(group: pd.DataFrame) -> pd.DataFrame:
    """One row per (weight bits, activation bits): the mean accuracy over the runs' calibration samples
    (one run per ``seed``), their standard deviation (ddof=1) and number, the execution mark (with the
    spread, for the heatmap) and the table's label (``85.2 ± 0.3 S``)."""
    runs = group.drop_duplicates(["weight_bits", "activation_bits", "seed"])
    cells = runs.groupby(["weight_bits", "activation_bits"], sort=True)
    out = pd.DataFrame(
        {
            "mean": cells["accuracy_pct"].mean(),
            "std": cells["accuracy_pct"].std(ddof=1),
            "seeds": cells.size(),
            "execution": cells["execution"].first().map(EXECUTION_MARK).fillna("?"),
        }
    )
    spread = out["std"].map(lambda std: f" ± {std:.1f}" if pd.notna(std) else "")
    out["mark"] = out["execution"] + spread.str.replace(" ± ", " ±", regex=False)
    out["label"] = [
        f"{mean:.1f}{spread_text} {execution}".rstrip()
        for mean, spread_text, execution in zip(out["mean"], spread, out["execution"], strict=True)
    ]
    return out


def fmt_cell(accuracy: float, mark: object) -> str:
    """``86.6 N`` for a map cell, ``-`` where the configuration did not run."""
    return "-" if pd.isna(accuracy) else f"{accuracy:.1f} {mark}".rstrip()


def algorithm_section(table: pd.DataFrame) -> list[str]:
    """Accuracy of each configuration with each PTQ algorithm (`algo`), when the runs vary it."""
    quantized = configured(table)
    algos = sorted(quantized["algo"].unique(), key=lambda name: (name != "none", name))
    if len(algos) < 2:
        return []
    setting = quantized["backend"] + " " + quantized["dtype"] + " " + quantized["calib"]
    setting += np.where(quantized["per_channel"] == "true", " per-channel", " per-tensor")
    grid = quantized.assign(setting=setting).drop_duplicates(["setting", "algo"])
    accuracy = grid.pivot(index="setting", columns="algo", values="accuracy_pct").reindex(columns=algos)
    rows = [[name, *(fmt_cell(value, "") for value in row)] for name, row in accuracy.iterrows()]
    note = "Accuracy (%) of each configuration quantized after each algorithm (`-`: not run)."
    return ["## PTQ algorithms", note, Table(["configuration", *algos], rows).markdown()]
