"""What the report concludes from the comparison table: recommended configurations, configurations over the
accuracy-drop limit, per-class changes, Pareto fronts, and which machines the runs came from."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from resnet8ptq.report.classes import class_columns
from resnet8ptq.report.runs import configured, without_device
from resnet8ptq.statistics import significant

SIZE_TOLERANCE = 0.01  # model sizes within 1% count as equal when picking the smallest
THROUGHPUT_TOLERANCE = 0.05  # throughputs within 5% (timing noise) count as equal when picking the fastest


def fmt(value: float | None, spec: str, suffix: str = "") -> str:
    """Format a number, `n/a` when it is missing."""
    return "n/a" if value is None or not np.isfinite(value) else f"{value:{spec}}{suffix}"


def interval(row: pd.Series) -> str:
    """`95% CI 86.05-87.38` (percent, of the compared accuracy), or `95% CI n/a`."""
    low, high = row.get("ci_low_pct", np.nan), row.get("ci_high_pct", np.nan)
    return f"95% CI {fmt(low, '.2f')}-{fmt(high, '.2f')}"


def fmt_p(p_value: float) -> str:
    """A (Holm-adjusted) p-value for a table: `0.012 *` when significant, `<0.001 *`, `0.41`, `—` if none."""
    if not np.isfinite(p_value):
        return "—"
    text = "<0.001" if p_value < 0.001 else f"{p_value:.3f}"
    return text + (" *" if significant(p_value) else "")


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
    """The best candidate by `by`; values within `tolerance` (rel.) of the best tie: most accurate wins
    (by the compared accuracy, `accuracy_pct`: on the device for a device run)."""
    values = candidates[by].dropna()
    if values.empty:
        return None
    best = values.min() if smaller_is_better else values.max()
    close = values <= best * (1 + tolerance) if smaller_is_better else values >= best * (1 - tolerance)
    ranked = candidates.loc[close[close].index].sort_values(
        ["accuracy_pct", by, "label"], ascending=[False, smaller_is_better, True], kind="stable"
    )
    row = ranked.iloc[0]
    return Pick(what, row["label"], row["run_id"], describe(row))


def describe(row: pd.Series) -> str:
    """`86.73% (95% CI 86.05-87.38; -0.46 points vs FP32), 108.0 KiB (2.90x smaller), 2668 img/s, 0.094 ms
    at batch 1` (`AUC 0.8712` for an autoencoder); a device run's accuracy `on the device`, and a costed
    one's chip instead of the file and the desktop's speed: `1.07 µJ, 0.500 mm², 364 µs per inference on the
    chip (23.4 TOPS/W)`."""
    where = " on the device" if row.get("on_device", False) else ""
    accuracy = f"{score(row)}{where} ({interval(row)}; {fmt(row['delta_points'], '+.2f')} points vs FP32), "
    if is_costed(row):
        return accuracy + chip_figures(row)
    return accuracy + (
        f"{fmt(row['size_kib'], '.1f')} KiB ({fmt(row['size_reduction'], '.2f', 'x')} smaller), "
        f"{fmt(row['throughput_img_s'], '.0f')} img/s, {fmt(row['latency_ms_b1'], '.3f')} ms at batch 1"
    )


def score(row: pd.Series) -> str:
    """The run's compared score: `86.73%`, or `AUC 0.8712` for an autoencoder (held x100 in the accuracy
    columns)."""
    if row.get("metric") == "auc":
        return f"AUC {fmt(row['accuracy_pct'] / 100, '.4f')}"
    return fmt(row["accuracy_pct"], ".2f", "%")


def is_costed(row: pd.Series) -> bool:
    """A device run whose chip was costed (resnet8ptq/components/)."""
    return bool(np.isfinite(row.get("device_energy_uj", np.nan)))


def chip_figures(row: pd.Series) -> str:
    """`1.07 µJ, 0.500 mm², 364 µs per inference on the chip (23.4 TOPS/W)`."""
    return (
        f"{fmt(row['device_energy_uj'], '.3g', ' µJ')}, {fmt(row['device_area_mm2'], '.3g', ' mm²')}, "
        f"{fmt(row['device_latency_us'], '.3g', ' µs')} per inference on the chip "
        f"({fmt(row['device_tops_per_w'], '.3g', ' TOPS/W')})"
    )


def recommendations(table: pd.DataFrame, max_drop_points: float) -> tuple[list[Pick], pd.DataFrame]:
    """:func:`network_recommendations` of the table, or of each network's runs where it holds several (a
    network's accuracy, or AUC, says nothing of another's: each pick's ``what`` then names its network)."""
    networks = sorted(set(table.get("network", ())))
    if len(networks) < 2:
        return network_recommendations(table, max_drop_points)
    picks, over = [], []
    for network in networks:
        own, own_over = network_recommendations(table[table["network"] == network], max_drop_points)
        picks += [
            pick
            if pick.what.startswith("Best ") and ":" in pick.what
            else Pick(f"{pick.what}, {network}", pick.label, pick.run_id, pick.detail)
            for pick in own
        ]
        over.append(own_over)
    return picks, pd.concat(over).sort_values("delta_points")


def network_recommendations(table: pd.DataFrame, max_drop_points: float) -> tuple[list[Pick], pd.DataFrame]:
    """Best accuracy (and best on a device when some runs have none), smallest, fastest, best per backend
    (quantized configurations this tool made, not published models), by the accuracy the report compares
    (on the device for a device run: :func:`~resnet8ptq.report.runs.compared_accuracy`); and the runs over
    the drop limit.

    Smallest and fastest consider the configurations within the limit (all when none is); sizes within
    SIZE_TOLERANCE and throughputs within THROUGHPUT_TOLERANCE count as ties, won by the most accurate. A
    device run whose chip was costed is judged by its chip (least energy, smallest and fastest chip), not
    by the desktop's file and speed.
    """
    quantized = configured(table)
    over = quantized[quantized["delta_points"].round(6) < -max_drop_points].sort_values("delta_points")
    pool = quantized.drop(over.index) if len(over) < len(quantized) else quantized
    devices = quantized[quantized["on_device"]]
    mixed = 0 < len(devices) < len(quantized)  # runs with and without a device: the best on one, too
    chips = pool[pool["device_energy_uj"].notna()]  # costed device runs: the chip, not the file, decides
    files = pool.drop(chips.index)
    picks = [
        _pick(quantized, "Best accuracy", "accuracy_pct", smaller_is_better=False),
        _pick(devices, "Best on a device", "accuracy_pct", smaller_is_better=False) if mixed else None,
        _pick(chips, "Least energy on the chip", "device_energy_uj", smaller_is_better=True),
        _pick(chips, "Smallest chip", "device_area_mm2", smaller_is_better=True),
        _pick(chips, "Fastest chip", "device_latency_us", smaller_is_better=True),
        _pick(files, "Smallest model", "model_size_bytes", smaller_is_better=True, tolerance=SIZE_TOLERANCE),
        *_fastest_per_machine(table, files),
        *(
            _pick(group, f"Best {backend}", "accuracy_pct", smaller_is_better=False)
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
    """Per-class accuracy change vs the FP32 baseline of the same backend, in points (classes x configs),
    each run over its own network's classes (``network: class`` where the table holds several networks); a
    device run's on the device (:func:`~resnet8ptq.report.significance.with_device_classes`), left out where
    unknown."""
    baselines = table[~table["quantized"]].drop_duplicates("backend").set_index("backend")
    several = len(set(table.get("network", ()))) > 1
    deltas, order = {}, []
    for _, row in table[table["quantized"]].iterrows():
        columns = class_columns(row["classes"])
        if row["backend"] not in baselines.index or not columns or not set(columns) <= set(table.columns):
            continue
        values = row[columns].to_numpy(float)
        baseline = baselines.loc[row["backend"], columns].to_numpy(float)
        if np.isnan(values).any() or np.isnan(baseline).any():
            continue
        names = [f"{row['network']}: {name}" if several else name for name in row["classes"]]
        deltas[row["label"]] = pd.Series((values - baseline) * 100, index=names)
        order += [name for name in names if name not in order]
    return pd.DataFrame(deltas, index=order, dtype=float)


def worst_classes(deltas: pd.DataFrame, limit: int = 5) -> pd.DataFrame:
    """The classes that lose the most: each class's worst change (points), under which config, the mean."""
    deltas = deltas.dropna(how="all")  # a class of a network no configuration here changed
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
    return pareto_mask(
        np.column_stack([np.asarray(x, float), np.asarray(accuracy, float)]), [not minimize_x, True]
    )


def pareto_mask(values: np.ndarray, maximize: list[bool]) -> np.ndarray:
    """Mask of the rows of ``values`` (points x objectives) that no other row dominates: at least as good in
    every objective and better in one (``maximize[k]``: objective k is maximised, else minimised)."""
    oriented = np.asarray(values, float) * np.where(maximize, 1.0, -1.0)
    at_least = (oriented[None, :, :] >= oriented[:, None, :]).all(axis=2)
    strictly = (oriented[None, :, :] > oriented[:, None, :]).any(axis=2)
    return ~(at_least & strictly).any(axis=1)


def machine_names(table: pd.DataFrame) -> dict[str, str]:
    """Short names (M1, M2, ...) for the machines the runs were measured on, by hardware label."""
    return {label: f"M{i}" for i, label in enumerate(sorted(table["hardware"].unique()), 1)}


def hardware_lines(table: pd.DataFrame) -> list[str]:
    """The report header's hardware: the one machine, or each machine and a warning that speed and native
    accuracy compare only within one machine."""
    machines = machine_names(table)
    if len(machines) <= 1:
        return [f"hardware: {label}" for label in machines]
    listed = "; ".join(f"{short} = {label}" for label, short in machines.items())
    return [
        f"**runs from {len(machines)} machines** ({listed}): accuracy (the reference semantics) compares "
        f"across them; speed and native accuracy only within one machine (column `machine`)"
    ]


def costed(table: pd.DataFrame) -> pd.DataFrame:
    """The configured runs whose chip was costed, each with ``model`` (its quantized model's configuration,
    the device aside)."""
    runs = configured(table)
    runs = runs[runs["device_energy_uj"].notna()].copy()
    runs["model"] = without_device(runs["config"])
    return runs
