"""A sweep's accuracy maps in the run explorer: one setting against another, each cell the newest run's
accuracy (or the mean over seeds), as HTML with a link per cell."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pandas as pd


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


CHIP_COSTS = {"device_energy_uj": "energy per inference (µJ)", "device_area_mm2": "the chip's area (mm²)"}
"""A costed chip's figures the explorer draws accuracy against (resnet8ptq/components/)."""


def chip_frontier(table: pd.DataFrame, cost: str) -> pd.DataFrame:
    """The device runs whose chip was costed (``cost``, one of :data:`CHIP_COSTS`, logged), cheapest first,
    with ``on_front``: on the Pareto front of accuracy on the device against ``cost``, as the report marks
    it."""
    from resnet8ptq.report.analysis import pareto_front

    chips = table[table[cost].notna() & table["accuracy_device"].notna()].sort_values(cost, kind="stable")
    front = pareto_front(chips[cost].to_numpy(), chips["accuracy_device"].to_numpy(), minimize_x=True)
    return chips.assign(on_front=front).reset_index(drop=True)
