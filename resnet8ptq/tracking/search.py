"""MLflow search filters built from values, quoted so that a value cannot change the filter's meaning."""

from __future__ import annotations

from collections.abc import Mapping

from mlflow.entities import Run
from mlflow.tracking import MlflowClient


def equals(field: str, value: str) -> str:
    """``<field> = '<value>'`` in MLflow's filter syntax: ``tags.<key>``, ``attributes.<name>`` fields; a tag
    key with a dot is backquoted. MLflow strips the quotes without unescaping, so the value is quoted with a
    quote character it does not contain; a value containing both kinds is refused."""
    kind, _, key = field.partition(".")
    if kind == "tags" and "." in key:
        field = f"tags.`{key}`"
    quote = "'" if "'" not in value else '"'
    if quote in value:
        raise ValueError(f"Cannot search MLflow for {field} = {value!r}: it contains both kinds of quotes.")
    return f"{field} = {quote}{value}{quote}"


def where(conditions: Mapping[str, str]) -> str:
    """The conditions (field -> value) joined with `and`."""
    return " and ".join(equals(field, value) for field, value in conditions.items())


def search_all(client: MlflowClient, experiment_ids: list[str], conditions: Mapping[str, str]) -> list[Run]:
    """Every run matching the conditions (all pages)."""
    runs, token = [], None
    while True:
        page = client.search_runs(experiment_ids, where(conditions), max_results=1000, page_token=token)
        runs += list(page)
        token = page.token
        if not token:
            return runs
