"""Registering the report's recommendation in the MLflow Model Registry (setting `mlflow.register_as`)."""

from __future__ import annotations

import logging

import mlflow
from mlflow.entities.model_registry import ModelVersion
from mlflow.tracking import MlflowClient

from resnet8ptq.report.analysis import recommendations
from resnet8ptq.report.runs import comparison_table, runs_frame
from resnet8ptq.tracking.search import search_all

log = logging.getLogger(__name__)


def register_most_accurate(
    parent_run_id: str, name: str, max_drop_points: float, tracking_uri: str | None = None
) -> ModelVersion | None:
    """Register the logged model of the sweep's most accurate quantized configuration (the report's "Best
    accuracy") as a new version of registered model ``name``; None when no quantized run finished or the
    sweep ran several networks."""
    client = MlflowClient(tracking_uri)
    parent = client.get_run(parent_run_id)
    children = search_all(client, [parent.info.experiment_id], {"tags.mlflow.parentRunId": parent_run_id})
    table = comparison_table(runs_frame(children))
    if not table["quantized"].any():
        log.warning("Nothing registered as %r: no quantized run of sweep %s finished", name, parent_run_id)
        return None
    if table["network"].nunique() > 1:
        log.warning(
            "Nothing registered as %r: sweep %s ran several networks; register one's", name, parent_run_id
        )
        return None
    best = next(pick for pick in recommendations(table, max_drop_points)[0] if pick.what == "Best accuracy")
    uri = client.get_run(best.run_id).data.tags["model_uri"]
    version = mlflow.register_model(uri, name, tags={"source_run": best.run_id, "configuration": best.label})
    client.set_tag(parent_run_id, "registered_model", f"{name} version {version.version}: {best.label}")
    log.info("Registered %s (%s) as %s version %s", best.label, uri, name, version.version)
    return version
