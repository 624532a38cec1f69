"""`python -m resnet8ptq.diff RUN_A RUN_B [--tracking-uri URI] [--tracking-uri-b URI]`: where two runs part,
stage by stage in the order a run makes things (configuration, library versions, hardware, calibration
sample, calibration ranges, model, integer form, predictions, device predictions), with the first difference
named, and a one-line verdict (e.g. "same model, different reference pass, on other hardware": the models
are the same bytes and only the CPU's float kernels of the reference pass moved predictions). The runs may
sit in two tracking stores (a colleague's, another machine's). Exit 0: no difference, 1: they differ, 2: a
run or store is missing."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import mlflow
import numpy as np
import pandas as pd
from mlflow.entities import Run
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from resnet8ptq.data import CLASS_NAMES
from resnet8ptq.errors import ReportError
from resnet8ptq.tracking.identity import result_settings
from resnet8ptq.tracking.store import check_store_exists

EXIT_SAME, EXIT_DIFFERENT, EXIT_MISSING = 0, 1, 2


@dataclass(frozen=True)
class Side:
    """One run and the store it is in."""

    client: MlflowClient
    run: Run

    @property
    def tags(self) -> dict[str, str]:
        return self.run.data.tags

    def table(self, artifact: str) -> pd.DataFrame | None:
        """A CSV artifact of the run, or ``None`` when it has none."""
        try:
            return pd.read_csv(self.client.download_artifacts(self.run.info.run_id, artifact))
        except (MlflowException, OSError):
            return None


@dataclass(frozen=True)
class Stage:
    """One comparison: its name, and what it finds (``None``: the same, or not recorded by either run)."""

    name: str
    compare: Callable[[Side, Side], str | None]


def _mapping(a: dict[str, str], b: dict[str, str], what: str, absent: str = "—") -> str | None:
    changed = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    if not changed:
        return None
    shown = ", ".join(f"{k}: {a.get(k, absent)} vs {b.get(k, absent)}" for k in changed[:5])
    more = f" (and {len(changed) - 5} more)" if len(changed) > 5 else ""
    return f"{len(changed)} {what} differ: {shown}{more}"


def _tagged(prefix: str, what: str) -> Callable[[Side, Side], str | None]:
    def compare(a: Side, b: Side) -> str | None:
        return _mapping(
            {k: v for k, v in a.tags.items() if k.startswith(prefix)},
            {k: v for k, v in b.tags.items() if k.startswith(prefix)},
            what,
        )

    return compare


def configuration(a: Side, b: Side) -> str | None:
    """The settings that decide a result (paths, stores and report settings apart)."""
    first, second = result_settings(a.run.data.params), result_settings(b.run.data.params)
    return _mapping(first, second, "settings", absent="default")


def calibration_sample(a: Side, b: Side) -> str | None:
    def sample(side: Side) -> dict[str, str]:
        inputs = side.run.inputs.dataset_inputs if side.run.inputs else []
        found = sorted(
            f"{i.dataset.name} ({i.dataset.digest})"
            for i in inputs
            if any(t.key == "mlflow.data.context" and t.value == "calibration" for t in i.tags)
        )
        return {"calibration": ", ".join(found)} if found else {}

    return _mapping(sample(a), sample(b), "calibration samples")


def _digest(
    tag: str, detail: Callable[[Side, Side], str] | None = None
) -> Callable[[Side, Side], str | None]:
    def compare(a: Side, b: Side) -> str | None:
        first, second = a.tags.get(tag), b.tags.get(tag)
        if first == second:
            return None
        if first is None or second is None:
            return f"only run {'B' if first is None else 'A'} records {tag}"
        found = detail(a, b) if detail else None
        return f"{tag} {first} vs {second}" + (f": {found}" if found else "")

    return compare


def ranges_detail(a: Side, b: Side) -> str | None:
    """Which tensors' ranges differ, and the one that moved most (relative to its span)."""
    first, second = (
        a.table("calibration/calibration_ranges.csv"),
        b.table("calibration/calibration_ranges.csv"),
    )
    if first is None or second is None:
        return None
    both = first.merge(second, on="tensor", how="outer", suffixes=("_a", "_b"), indicator=True)
    unmatched = int((both["_merge"] != "both").sum())
    both = both[both["_merge"] == "both"]
    moved = both[(both["min_a"] != both["min_b"]) | (both["max_a"] != both["max_b"])]
    if moved.empty:
        return f"{unmatched} tensors in one run only" if unmatched else None
    span = (moved["max_a"] - moved["min_a"]).abs().replace(0, 1)
    change = ((moved["min_a"] - moved["min_b"]).abs() + (moved["max_a"] - moved["max_b"]).abs()) / span
    worst = moved.loc[change.idxmax()]
    return (
        f"{len(moved)} of {len(both)} tensors' ranges differ; most: {worst['tensor']} "
        f"[{float(worst['min_a'])!r}, {float(worst['max_a'])!r}] vs "
        f"[{float(worst['min_b'])!r}, {float(worst['max_b'])!r}] "
        f"({change.max():.2g} of its span)" + (f"; {unmatched} tensors in one run only" if unmatched else "")
    )


def _predictions_detail(artifact: str, column: str) -> Callable[[Side, Side], str | None]:
    def detail(a: Side, b: Side) -> str | None:
        first, second = a.table(artifact), b.table(artifact)
        if first is None or second is None or len(first) != len(second):
            return None
        differ = first[column].to_numpy() != second[column].to_numpy()
        labels = first["label"].to_numpy()
        classes = np.bincount(labels[differ], minlength=len(CLASS_NAMES))
        cifar10 = a.tags.get("data", "cifar10") == "cifar10"  # other data: classes by their label
        names = CLASS_NAMES if cifar10 else tuple(f"class {c}" for c in range(len(classes)))
        named = ", ".join(f"{names[c]} {classes[c]}" for c in np.argsort(-classes)[:3] if classes[c])
        right_a = int((first[column].to_numpy() == labels).sum())
        right_b = int((second[column].to_numpy() == labels).sum())
        return (
            f"{int(differ.sum())} of {len(first)} images predicted differently (most in {named}); "
            f"correct {right_a} vs {right_b}"
        )

    return detail


STAGES = (
    Stage("configuration", configuration),
    Stage("library versions", _tagged("version.", "library versions")),
    Stage("hardware", _tagged("hardware.", "hardware facts")),
    Stage("calibration sample", calibration_sample),
    Stage("calibration ranges", _digest("digest.calibration_ranges", ranges_detail)),
    Stage("model", _digest("digest.model")),
    Stage("integer form", _digest("digest.integer_model")),
    Stage(
        "predictions",
        _digest("digest.predictions", _predictions_detail("evaluation/predictions.csv", "predicted")),
    ),
    Stage(
        "device predictions",
        _digest("digest.device_predictions", _predictions_detail("device/predictions.csv", "device")),
    ),
)
"""What two runs are compared on, in the order a run makes it."""


MADE_STAGES = ("calibration ranges", "model")
"""The stages that say whether two runs made the same model."""
CIRCUMSTANCES = {"hardware": "on other hardware", "library versions": "with other library versions"}
"""The stages that say why the same configuration can make or run differently."""


def verdict(found: Sequence[tuple[str, str | None]]) -> str:
    """One line on what ``found`` (:func:`differences`) means: a different configuration or calibration
    sample, a different model, or the same model whose integer form or predictions (reference pass, device)
    differ; and where hardware or library versions differ, that too."""
    differs = [name for name, difference in found if difference is not None]
    circumstances = [CIRCUMSTANCES[name] for name in differs if name in CIRCUMSTANCES]
    if "configuration" in differs or "calibration sample" in differs:
        what = "different " + ("configuration" if "configuration" in differs else "calibration sample")
    elif any(name in MADE_STAGES for name in differs):
        what = "different model"
    else:
        outcomes = {
            "integer form": "different integer form",
            "predictions": "different reference pass",
            "device predictions": "different device predictions",
        }
        parted = [outcome for name, outcome in outcomes.items() if name in differs]
        what = "same model, " + (", ".join(parted) if parted else "same predictions")
    return ", ".join([what, *circumstances])


def differences(a: Side, b: Side) -> list[tuple[str, str | None]]:
    """Every stage with what differs in it (``None``: nothing)."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # no bars between the lines
    return [(stage.name, stage.compare(a, b)) for stage in STAGES]


def side(run_id: str, uri: str) -> Side:
    check_store_exists(uri)
    client = MlflowClient(uri)
    try:
        return Side(client, client.get_run(run_id))
    except MlflowException as error:
        raise ReportError(f"No run {run_id} in {uri}: {error.message}") from error


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m resnet8ptq.diff", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_a", metavar="RUN_A", help="a run id")
    parser.add_argument("run_b", metavar="RUN_B", help="another run id")
    parser.add_argument("--tracking-uri", help="RUN_A's store (default: MLflow's, sqlite:///mlflow.db)")
    parser.add_argument("--tracking-uri-b", help="RUN_B's store (default: RUN_A's)")
    args = parser.parse_args(argv)
    uri_a = args.tracking_uri or mlflow.get_tracking_uri()
    try:
        a, b = side(args.run_a, uri_a), side(args.run_b, args.tracking_uri_b or uri_a)
    except ReportError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_MISSING
    found = differences(a, b)
    print(f"A: {a.run.info.run_name} ({a.run.info.run_id})\nB: {b.run.info.run_name} ({b.run.info.run_id})")
    for name, difference in found:
        print(f"  {name:20s} {'same' if difference is None else 'DIFFERS: ' + difference}")
    first = next(((name, d) for name, d in found if d is not None), None)
    print(f"first difference: {first[0]}: {first[1]}" if first else "no difference")
    print(f"verdict: {verdict(found)}")
    return EXIT_DIFFERENT if first else EXIT_SAME


if __name__ == "__main__":
    sys.exit(main())
