"""`python -m resnet8ptq.report [--sweep RUN_ID | --experiment NAME] [--tracking-uri URI] [--out DIR]
[--max-drop POINTS]`: the comparison report of the newest sweep, a given one, or a whole experiment."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import mlflow
from mlflow.tracking import MlflowClient

from resnet8ptq.config import MlflowConfig, ReportConfig
from resnet8ptq.errors import ReportError
from resnet8ptq.report.runs import latest_sweep_run
from resnet8ptq.report.writer import write_experiment_report, write_report
from resnet8ptq.tracking.store import check_store_exists

EXIT_NOTHING_TO_REPORT = 3
DEFAULT_EXPERIMENT = MlflowConfig.experiment


def main(argv: Sequence[str] | None = None) -> int:
    """CLI; exit 0 = report written, 3 = nothing to report, 2 = no such sweep/experiment/store."""
    parser = argparse.ArgumentParser(
        prog="python -m resnet8ptq.report",
        description="Comparison report (Markdown + self-contained HTML + PNGs) of a sweep's MLflow runs.",
    )
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "--sweep",
        metavar="RUN_ID",
        help=f"parent run of the sweep (default: the most recent in experiment {DEFAULT_EXPERIMENT})",
    )
    scope.add_argument("--experiment", metavar="NAME", help="report on every run of this experiment instead")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default: MLflow's, sqlite:///mlflow.db)")
    parser.add_argument("--out", type=Path, help="output directory (default: the sweep's runs/ directory)")
    parser.add_argument(
        "--max-drop",
        type=float,
        default=ReportConfig.max_drop_points,
        metavar="POINTS",
        help="flag configurations losing more accuracy than this vs FP32 (default: %(default)s)",
    )
    parser.add_argument(
        "--chip-drop",
        type=float,
        default=ReportConfig.chip_drop_points,
        metavar="POINTS",
        help="name the cheapest costed chip within this many points of the integer device "
        "(default: %(default)s)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    uri = args.tracking_uri or mlflow.get_tracking_uri()
    try:
        check_store_exists(uri)
        if args.experiment:
            path = write_experiment_report(args.experiment, args.out, args.max_drop, uri, args.chip_drop)
        else:
            sweep = args.sweep or latest_sweep_run(MlflowClient(uri), DEFAULT_EXPERIMENT)
            path = write_report(sweep, args.out, args.max_drop, uri, args.chip_drop)
    except ReportError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except mlflow.exceptions.MlflowException as err:
        print(f"error: {err.message}", file=sys.stderr)
        return 2
    return EXIT_NOTHING_TO_REPORT if path is None else 0  # _finish logged where the report is
