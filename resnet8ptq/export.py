"""`python -m resnet8ptq.export RUN_ID [--tracking-uri URI] [--data-root DIR] [--out DIR] [--no-log]`: the
integer parameters and golden vectors of any quantized run's model (docs/device.md), logged into the run as
the artifacts ``device/`` (device runs log them already) and left in ``--out``."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import mlflow
from mlflow.tracking import MlflowClient

from resnet8ptq.errors import ExportError

MODEL_SUFFIXES = (".onnx", ".pt2", ".tflite")


def model_file(client: MlflowClient, run_id: str, directory: Path) -> tuple[str, Path]:
    """The run's backend and its quantized model file, downloaded into ``directory``."""
    run = client.get_run(run_id)
    if run.data.tags.get("quantized") != "true":
        raise ExportError(f"run {run_id} ({run.info.run_name}) is not a quantized run: nothing to export.")
    backend = run.data.tags["backend"]
    local = Path(client.download_artifacts(run_id, "model", str(directory)))
    files = [p for p in local.rglob("*") if p.suffix in MODEL_SUFFIXES and "fp32" not in p.name]
    if len(files) != 1:
        raise ExportError(f"run {run_id}: expected one quantized model under model/, found {files}.")
    return backend, files[0]


def main(argv: Sequence[str] | None = None) -> int:
    """CLI; exit 0 = exported, 2 = no such run / not exportable."""
    parser = argparse.ArgumentParser(prog="python -m resnet8ptq.export", description=__doc__.split(":", 1)[1])
    parser.add_argument("run_id", help="a quantized run's id")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default: MLflow's, sqlite:///mlflow.db)")
    parser.add_argument(
        "--data-root",
        type=Path,
        default=Path(os.environ.get("RESNET8PTQ_ASSETS", "data")),
        help="directory holding cifar-10-batches-bin/ (default: $RESNET8PTQ_ASSETS, else data/)",
    )
    parser.add_argument("--out", type=Path, help="where to leave the files (default: a temporary directory)")
    parser.add_argument("--no-log", action="store_true", help="do not log them into the run")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    client = MlflowClient(args.tracking_uri or mlflow.get_tracking_uri())
    from resnet8ptq.data import load_cifar10, to_model_input
    from resnet8ptq.device.export import export

    try:
        with tempfile.TemporaryDirectory() as scratch:
            backend, path = model_file(client, args.run_id, Path(scratch))
            reader = importlib.import_module(f"resnet8ptq.backends.{backend}.integer")
            model = reader.integer_model(path)
            images = to_model_input(load_cifar10(args.data_root, download=False).test_images[:16])
            out = args.out or Path(scratch) / "device"
            files = export(model, images, out)
            if not args.no_log:
                for file in files:
                    client.log_artifact(args.run_id, str(file), "device")
    except (ExportError, ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except mlflow.exceptions.MlflowException as err:
        print(f"error: {err.message}", file=sys.stderr)
        return 2
    where = f"run {args.run_id}, artifacts device/" + (f", and {args.out}" if args.out else "")
    logging.info("Exported %d files (%s): %s", len(files), model.source, where)
    return 0


if __name__ == "__main__":
    sys.exit(main())
