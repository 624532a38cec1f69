"""The report's networks: each network's metric and MLPerf Tiny quality target beside its FP32 model and its
best quantized configuration (the target is the model's ``model.quality_target``, logged with its run)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from resnet8ptq.markdown import Table
from resnet8ptq.report.runs import configured, scored_by_auc


def score(value_pct: float, metric: str) -> str:
    """A network's score as its metric is written: top-1 accuracy in percent, AUC as a fraction."""
    if not np.isfinite(value_pct):
        return "n/a"
    return f"{value_pct / 100:.4f} AUC" if metric == "auc" else f"{value_pct:.2f} %"


def network_rows(table: pd.DataFrame) -> Table:
    """One row per network: metric, quality target, best FP32 model, best quantized configuration (by the
    score the report compares by: on the device where a run has one) and whether it reaches the target."""
    rows = []
    quantized = configured(table)
    for network, runs in table.groupby("network", sort=True):
        metric = runs["metric"].fillna("top1").iloc[0]
        target = runs["quality_target"].dropna()
        target_pct = float(target.iloc[0]) * 100 if len(target) else np.nan
        fp32 = runs.loc[~runs["quantized"], "accuracy_pct"].max()
        own = quantized[quantized["network"] == network].dropna(subset=["accuracy_pct"])
        best = own.loc[own["accuracy_pct"].idxmax()] if len(own) else None
        reached = "—"
        if best is not None and np.isfinite(target_pct):
            reached = "yes" if round(best["accuracy_pct"], 6) >= round(target_pct, 6) else "**no**"
        rows.append(
            [
                network,
                "AUC" if metric == "auc" else "top-1",
                score(target_pct, metric),
                score(fp32, metric),
                f"{score(best['accuracy_pct'], metric)} ({best['label']})" if best is not None else "—",
                reached,
            ]
        )
    headers = [
        "network",
        "metric",
        "MLPerf quality target",
        "FP32 (best)",
        "best quantized",
        "reaches target",
    ]
    return Table(headers, rows)


def metric_note(table: pd.DataFrame) -> str | None:
    """The sentence that says which networks' `accuracy` is an AUC; None when every run is a classifier's."""
    scored = sorted(set(table.loc[scored_by_auc(table), "network"]))
    if not scored:
        return None
    return (
        f"For {', '.join(scored)} (an autoencoder scored as MLPerf Tiny scores it) the accuracy columns hold "
        "its AUC ×100 (metric `auc`; its interval DeLong's), and it has no per-class accuracy or paired "
        "McNemar test."
    )


def network_section(table: pd.DataFrame) -> list[str]:
    """The networks' quality targets; nothing for runs logged before runs carried their network's target."""
    if "quality_target" not in table or table["quality_target"].isna().all():
        return []
    note = (
        "MLPerf Tiny's closed-division quality targets (benchmark/README.md of mlcommons/tiny): image "
        "classification 85 % top-1, visual wake words 80 %, keyword spotting 90 %, anomaly detection 0.85 "
        "AUC; a network of one's own has the target its `model.quality_target` sets. On generated data "
        "(`python -m resnet8ptq.datasets generate`) a score says nothing of the target."
    )
    return ["## Networks", network_rows(table).markdown(), note]
