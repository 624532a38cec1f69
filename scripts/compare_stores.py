"""Compare what two MLflow stores hold, run by run: the check that a refactoring changed no run (issue 42,
"no behaviour change"). Runs are paired by name (a sweep's parent by its overrides); for each pair the
params, the tags (values too), the metrics (values too) and the artifact paths must be equal, leaving out
what differs between any two runs of the same configuration: times, ids, the host and process, the commit,
the output directory, the logged model's id. Prints every difference and exits 1 when there is one.

Usage: .venv/bin/python scripts/compare_stores.py sqlite:///before/mlflow.db sqlite:///after/mlflow.db
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from mlflow.entities import Run
from mlflow.tracking import MlflowClient

VOLATILE_TAGS = re.compile(
    r"mlflow\..*|host|pid|git_commit|sweep_dir|model_uri|device\.quantization_run|reused\..*|skipped\..*"
)
VOLATILE_METRICS = re.compile(r".*_seconds|throughput_img_s|latency_ms_b1|npu_.*_ms")


def store_dir(uri: str) -> str:
    """The folder of a SQLite store's file (``sqlite:////x/y/mlflow.db`` -> ``/x/y``): where its runs' own
    paths (the tracking URI in the overrides, the output directories) differ from the other store's."""
    return str(Path(uri.removeprefix("sqlite:///")).parent)


RUN_ID = re.compile(r"\b[0-9a-f]{32}\b")


def normalised(value: object, folder: str) -> object:
    """A string value with the store's folder and any run id (a run a tag names) replaced."""
    if not isinstance(value, str):
        return value
    return RUN_ID.sub("<run_id>", value.replace(folder, "<store>") if folder else value)


def runs_by_name(uri: str) -> dict[str, tuple[MlflowClient, Run, str]]:
    """Each run by its name (a parent: its overrides without the clock; a child: its parent's name, then its
    own), with the store's folder."""
    client, folder = MlflowClient(uri), store_dir(uri)
    experiment = client.get_experiment_by_name("resnet8ptq")
    runs = client.search_runs([experiment.experiment_id], max_results=5000)
    names = {run.info.run_id: normalised(run.info.run_name.rsplit(" @ ", 1)[0], folder) for run in runs}
    named = {}
    for run in runs:  # a child under its parent's name: each sweep has its own FP32 baseline runs
        parent = names.get(run.data.tags.get("mlflow.parentRunId", ""), "")
        key = f"{parent} / {names[run.info.run_id]}" if parent else names[run.info.run_id]
        if key in named:
            raise SystemExit(f"{uri}: two runs named {key!r}: cannot pair them")
        named[key] = (client, run, folder)
    return named


def artifacts(client: MlflowClient, run_id: str, path: str | None = None) -> set[str]:
    found = set()
    for item in client.list_artifacts(run_id, path):
        found |= artifacts(client, run_id, item.path) if item.is_dir else {item.path}
    return found


def kept(values: dict, volatile: re.Pattern[str], folder: str) -> dict:
    """``values`` without the keys that differ between any two runs of one configuration, the store's folder
    in them replaced."""
    return {key: normalised(value, folder) for key, value in values.items() if not volatile.fullmatch(key)}


def differences(before: str, after: str) -> list[str]:
    first, second = runs_by_name(before), runs_by_name(after)
    found = [f"only before: {name}" for name in sorted(first.keys() - second.keys())]
    found += [f"only after: {name}" for name in sorted(second.keys() - first.keys())]
    for name in sorted(first.keys() & second.keys()):
        (client_a, a, folder_a), (client_b, b, folder_b) = first[name], second[name]
        nothing = re.compile(r"\Z.")  # no param is volatile
        views = {
            "params": (kept(a.data.params, nothing, folder_a), kept(b.data.params, nothing, folder_b)),
            "tags": (kept(a.data.tags, VOLATILE_TAGS, folder_a), kept(b.data.tags, VOLATILE_TAGS, folder_b)),
            "metrics": (
                kept(a.data.metrics, VOLATILE_METRICS, ""),
                kept(b.data.metrics, VOLATILE_METRICS, ""),
            ),
            "artifacts": (artifacts(client_a, a.info.run_id), artifacts(client_b, b.info.run_id)),
        }
        for view, (x, y) in views.items():
            if x == y:
                continue
            if isinstance(x, set):
                found.append(f"{name}: {view} {sorted(x ^ y)}")
                continue
            keys = sorted(k for k in x.keys() | y.keys() if x.get(k) != y.get(k))
            found += [f"{name}: {view} {k}: {x.get(k)!r} -> {y.get(k)!r}" for k in keys]
    return found


def main() -> None:
    before, after = sys.argv[1:3]
    found = differences(before, after)
    print(f"{len(runs_by_name(before))} runs before, {len(runs_by_name(after))} after")
    print("\n".join(found) or "no difference")
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
