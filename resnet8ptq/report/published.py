"""The report's section on published models (MLPerf Tiny's own int8 .tflite) beside the sweep's int8
configurations, on the full test set and on MLPerf Tiny's performance subset."""

from __future__ import annotations

import numpy as np
import pandas as pd

from resnet8ptq.report.analysis import fmt, fmt_p
from resnet8ptq.report.runs import int8_configurations
from resnet8ptq.report.sections import Table


def published_section(table: pd.DataFrame) -> list[str]:
    """Each backend's int8/int8 configurations beside the published int8 models (MLPerf Tiny's own), on
    the full test set and on MLPerf Tiny's 200-image performance subset (a device run's on its device)."""
    published = table[table["reference"].fillna("") != ""]
    if published.empty:
        return []
    int8 = int8_configurations(table)
    rows = []
    for reference in published.itertuples():
        for r in [
            reference,
            *int8.sort_values(["backend", "accuracy_pct"], ascending=[True, False]).itertuples(),
        ]:
            rows.append(
                [
                    r.label,
                    f"{r.accuracy_pct:.2f}",
                    f"{r.accuracy_pct - reference.accuracy_pct:+.2f}",
                    fmt(r.perf_subset_pct, ".1f"),
                    fmt(r.perf_subset_pct - reference.perf_subset_pct, "+.1f"),
                    fmt_p(r.p_vs_published_holm) if r is not reference else "—",
                    fmt(r.accuracy_native * 100, ".2f") if np.isfinite(r.accuracy_native) else "—",
                    r.execution or "—",
                ]
            )
    headers = [
        "configuration",
        "accuracy (%)",
        "Δ vs published (points)",
        "perf subset (%)",
        "Δ perf subset (points)",
        "p vs published",
        "native (%)",
        "execution",
    ]
    note = (
        "Published int8 models (run tag `reference`) beside every int8/int8 configuration of this sweep: "
        "accuracy on all 10,000 test images and on MLPerf Tiny's 200-image performance subset (the figure "
        "MLPerf reports; one image is 0.5 points), both from the same predictions of the reference form; "
        "`p vs published`: exact McNemar test against the published model on the 10,000 test images, "
        "Holm-adjusted over these configurations (`*`: significant at 0.05). "
        "MLPerf Tiny's model was calibrated on 500 images of the *test* split "
        "(`calibration_samples_idxs.npy`); the toolchains here on 1,000 training images."
    )
    if int8["on_device"].any():
        note += " A device run's accuracies and test are on its device."
    return ["## Published models", note, Table(headers, rows).markdown()]
