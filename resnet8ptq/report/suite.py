"""One chip for a suite of networks (issue 74): over a sweep of several networks on the same chip designs (a
run's device label, e.g. ``cim-r128-adc5``), the design that keeps every network within a number of points of
its integer device at the least total energy (one inference of each network), and what each network's own
cheapest design would save against it."""

from __future__ import annotations

import pandas as pd

from resnet8ptq.markdown import Table
from resnet8ptq.report.analysis import fmt


def suite_section(runs: pd.DataFrame, drop_points: float) -> list[str]:
    """The suite's chip over costed ``runs`` of two or more networks (with ``vs_integer``: points against the
    integer device): a line naming the design and a table of each network on it beside its own cheapest
    design; empty for one network."""
    networks = sorted(runs["network"].unique())
    if len(networks) < 2:
        return []
    kept = runs[runs["vs_integer"].round(6) >= -drop_points]
    cheapest = kept.sort_values(["device_energy_uj", "accuracy_pct"], ascending=[True, False], kind="stable")
    per_design = cheapest.groupby(["device", "network"], sort=True).head(1)
    complete = per_design.groupby("device").filter(lambda design: set(design["network"]) == set(networks))
    heading = f"**One chip for the suite** ({', '.join(networks)})"
    if complete.empty:
        return [
            f"{heading}: no chip design of the sweep keeps every network within {drop_points:g} point(s) of "
            "its integer device."
        ]
    totals = complete.groupby("device")["device_energy_uj"].agg(["sum", "max"]).sort_values(["sum", "max"])
    design = str(totals.index[0])
    on_design = complete[complete["device"] == design].set_index("network")
    own = per_design.groupby("network").head(1).set_index("network")  # each network's cheapest design
    rows = []
    for network in networks:
        suite, best = on_design.loc[network], own.loc[network]
        saving = 1 - best["device_energy_uj"] / suite["device_energy_uj"]
        rows.append(
            [
                network,
                fmt(suite["device_energy_uj"], ".3g"),
                fmt(suite["vs_integer"], "+.2f"),
                str(best["device"]),
                fmt(best["device_energy_uj"], ".3g"),
                fmt(100 * saving, ".1f"),
            ]
        )
    worst = on_design["device_energy_uj"].idxmax()
    line = (
        f"{heading}: **{design}** keeps every network within {drop_points:g} point(s) of its integer device "
        f"at the least total energy, {fmt(totals.loc[design, 'sum'], '.3g', ' µJ')} for one inference of "
        f"each (the most: {worst}, {fmt(totals.loc[design, 'max'], '.3g', ' µJ')}); of the sweep's "
        f"{runs['device'].nunique()} designs, {len(totals)} keep{'s' * (len(totals) == 1)} them all."
    )
    headers = [
        "network", "energy on the suite's chip (µJ)", "vs its integer device (points)",
        "its own cheapest chip", "its energy (µJ)", "saving (%)",
    ]  # fmt: skip
    return [line, Table(headers, rows).markdown()]
