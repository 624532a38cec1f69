"""Which differences the report shows are real: paired McNemar tests on the runs' per-image predictions
(artifact ``evaluation/predictions.csv``), and the spread of a configuration over calibration samples
(``data.seed``)."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from resnet8ptq.artifacts import EVALUATION_DIR, PREDICTIONS_FILE
from resnet8ptq.report.runs import TEST_COLUMNS
from resnet8ptq.statistics import holm, mcnemar
from resnet8ptq.tracking.models import quiet_downloads

log = logging.getLogger(__name__)


def load_correctness(client: MlflowClient, run_ids: list[str]) -> dict[str, np.ndarray]:
    """Per-image correctness (bool array in test-set order) of every run that logged its predictions on the
    same test images; runs without the artifact (logged before it existed) or on other images are left out."""
    correct: dict[str, np.ndarray] = {}
    labels: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory() as scratch, quiet_downloads():
        for run_id in run_ids:
            try:
                path = client.download_artifacts(run_id, f"{EVALUATION_DIR}/{PREDICTIONS_FILE}", scratch)
                frame = pd.read_csv(path, index_col="image").sort_index()
            except (MlflowException, OSError, ValueError, KeyError) as err:
                log.debug("No predictions for run %s: %s", run_id, err)
                continue
            correct[run_id] = (frame["predicted"] == frame["label"]).to_numpy()
            labels[run_id] = frame["label"].to_numpy()
            Path(path).unlink(missing_ok=True)
    if not labels:
        return {}
    reference = max(labels.values(), key=lambda array: sum(np.array_equal(array, o) for o in labels.values()))
    return {run_id: correct[run_id] for run_id in correct if np.array_equal(labels[run_id], reference)}


def paired_tests(table: pd.DataFrame, correct: dict[str, np.ndarray]) -> pd.DataFrame:
    """The comparison table with paired-test columns (NaN where a run has no predictions):

    - ``p_vs_fp32`` / ``p_vs_fp32_holm``: each quantized configuration against its backend's FP32 model
      (two-sided exact McNemar; Holm-adjusted over all those comparisons);
    - ``p_vs_best`` / ``p_vs_best_holm``: each quantized configuration against the most accurate one (the
      report's *Best accuracy*), Holm-adjusted over those comparisons.
    """
    table = table.assign(**{column: np.nan for column in TEST_COLUMNS})  # no stale values
    quantized = table[table["quantized"] & table["run_id"].isin(correct)]
    fp32 = table[~table["quantized"] & table["run_id"].isin(correct)].drop_duplicates("backend")
    fp32_run = dict(zip(fp32["backend"], fp32["run_id"], strict=True))
    pairs = [(i, fp32_run[row.backend]) for i, row in quantized.iterrows() if row.backend in fp32_run]
    _fill(table, pairs, correct, "p_vs_fp32")
    if len(quantized):
        best = quantized.sort_values(["accuracy", "label"], ascending=[False, True], kind="stable").iloc[0]
        pairs = [(i, best["run_id"]) for i in quantized.index if i != best.name]
        _fill(table, pairs, correct, "p_vs_best")
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
