"""Which differences the report shows are real: paired McNemar tests on the runs' per-image predictions
(artifact ``evaluation/predictions.csv``; a device run's ``device/predictions.csv``), and the spread of a
configuration over calibration samples (``data.seed``)."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from resnet8ptq.artifacts import EVALUATION_DIR, PREDICTIONS_FILE
from resnet8ptq.report.classes import class_columns
from resnet8ptq.report.runs import TEST_COLUMNS, configured, int8_configurations, scored_by_auc
from resnet8ptq.statistics import holm, mcnemar
from resnet8ptq.tracking.models import quiet_downloads

log = logging.getLogger(__name__)

Source = tuple[str, str]
"""Where a run's predictions are: (artifact path, column)."""
REFERENCE_PREDICTIONS: Source = (f"{EVALUATION_DIR}/{PREDICTIONS_FILE}", "predicted")
DEVICE_PREDICTIONS: Source = ("device/predictions.csv", "device")  # the first noise draw's (seed 0)


def prediction_sources(table: pd.DataFrame) -> dict[str, Source]:
    """Where each run's predictions of the accuracy the report compares are: the reference's, or a device
    run's on the device. A device run whose accuracy is a mean over noise draws that differ
    (``accuracy_device_std`` > 0) has none: its predictions file holds one draw, which does not stand for
    the mean; nor has a run scored by AUC (McNemar's test compares right and wrong predictions)."""
    noisy = table["on_device"] & (table["accuracy_device_std"].fillna(0) > 0)
    noisy |= scored_by_auc(table)  # an AUC is not a count of right predictions
    return {
        row.run_id: DEVICE_PREDICTIONS if row.on_device else REFERENCE_PREDICTIONS
        for row in table[~noisy].itertuples()
    }


def load_correctness(
    client: MlflowClient, sources: dict[str, Source]
) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
    """Per-image correctness (bool array in test-set order) of every run (``sources``: run id -> where its
    predictions are) that logged its predictions on the same test images, and those images' labels (None
    without any); runs without the artifact (logged before it existed) or on other images are left out."""
    correct: dict[str, np.ndarray] = {}
    labels: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory() as scratch, quiet_downloads():
        for run_id, (artifact, column) in sources.items():
            try:
                path = client.download_artifacts(run_id, artifact, scratch)
                frame = pd.read_csv(path, index_col="image").sort_index()
                correct[run_id] = (frame[column] == frame["label"]).to_numpy()
            except (MlflowException, OSError, ValueError, KeyError) as err:
                log.debug("No predictions for run %s: %s", run_id, err)
                continue
            labels[run_id] = frame["label"].to_numpy()
            Path(path).unlink(missing_ok=True)
    if not labels:
        return {}, None
    reference = max(labels.values(), key=lambda array: sum(np.array_equal(array, o) for o in labels.values()))
    same = {run_id: correct[run_id] for run_id in correct if np.array_equal(labels[run_id], reference)}
    return same, reference


def with_device_classes(
    table: pd.DataFrame, correct: dict[str, np.ndarray], labels: np.ndarray | None
) -> pd.DataFrame:
    """The table with a device run's per-class accuracies (``class_acc/*`` of its network's classes) on the
    device, from its device predictions (``correct``); NaN where they are not known (no predictions, or a
    noisy run's mean over draws). The logged ``class_acc/*`` of a device run are its reference's."""
    table = table.copy()
    for index in table.index[table["on_device"]]:
        classes = table.at[index, "classes"]
        columns = class_columns(classes)
        run = correct.get(table.at[index, "run_id"])
        known = run is not None and labels is not None and len(classes) > 0
        values = [float(run[labels == k].mean()) for k in range(len(classes))] if known else np.nan
        for column in columns:
            if column not in table:
                table[column] = np.nan
        table.loc[index, columns] = values
    return table


def paired_tests(table: pd.DataFrame, correct: dict[str, np.ndarray]) -> pd.DataFrame:
    """The comparison table with paired-test columns (NaN where a run has no predictions), each two-sided
    exact McNemar, Holm-adjusted over its family of comparisons:

    - ``p_vs_fp32`` / ``p_vs_fp32_holm``: each quantized configuration against its backend's FP32 model;
    - ``p_vs_best`` / ``p_vs_best_holm``: each quantized configuration against the most accurate one (the
      report's *Best accuracy*);
    - ``p_vs_published`` / ``p_vs_published_holm``: each int8/int8 configuration against the published int8
      model (MLPerf Tiny's), when the table has one. A published model is in no other family.
    """
    table = table.assign(**{column: np.nan for column in TEST_COLUMNS})  # no stale values
    tested = table[table["run_id"].isin(correct)]
    own = configured(tested)
    fp32 = tested[~tested["quantized"]].drop_duplicates("backend")
    fp32_run = dict(zip(fp32["backend"], fp32["run_id"], strict=True))
    _fill(
        table,
        [(i, fp32_run[row.backend]) for i, row in own.iterrows() if row.backend in fp32_run],
        correct,
        "p_vs_fp32",
    )
    if len(own):
        best = own.sort_values(["accuracy_pct", "label"], ascending=[False, True], kind="stable").iloc[0]
        _fill(table, [(i, best["run_id"]) for i in own.index if i != best.name], correct, "p_vs_best")
    published = tested[tested["quantized"]].drop(own.index)
    if len(published) == 1:
        pairs = [(i, published["run_id"].iloc[0]) for i in int8_configurations(own).index]
        _fill(table, pairs, correct, "p_vs_published")
    return table


def _fill(
    table: pd.DataFrame, pairs: list[tuple[int, str]], correct: dict[str, np.ndarray], name: str
) -> None:
    """Test each (row, other run) pair; write the p-values and their Holm adjustment into ``name`` columns."""
    if not pairs:
        return
    p_values = [mcnemar(correct[table.at[i, "run_id"]], correct[other]).p_value for i, other in pairs]
    rows = [i for i, _ in pairs]
    table.loc[rows, name] = p_values
    table.loc[rows, f"{name}_holm"] = holm(p_values)


def seed_spread(table: pd.DataFrame) -> pd.DataFrame:
    """Per configuration run with more than one calibration sample (``data.seed``; runs with the same other
    settings): the number of seeds and the mean, standard deviation (ddof=1), minimum and maximum accuracy
    (%)."""
    quantized = table[table["quantized"] & (table["seed"] != "")]
    groups = quantized.groupby("settings", sort=True)
    spread = groups["accuracy_pct"].agg(["mean", "std", "min", "max"])
    spread = spread.join(groups["seed"].nunique().rename("seeds")).join(groups["config"].first())
    spread = spread.reset_index()
    repeated = spread["config"].duplicated(keep=False)  # one name, other settings: tell them apart
    spread.loc[repeated, "config"] += " [" + spread.loc[repeated, "settings"].str[:6] + "]"
    return spread[spread["seeds"] > 1].sort_values("mean", ascending=False, kind="stable")
