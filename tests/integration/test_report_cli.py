"""The comparison report after a real CLI sweep: written beside the sweep and logged to its parent run."""

from __future__ import annotations

from pathlib import Path

from mlflow.tracking import MlflowClient

from resnet8ptq.report import writer as report
from tests.unit.test_report import REPORT_FILES


def test_real_sweep_writes_the_report(run_cli, tmp_path: Path) -> None:
    result = run_cli(tmp_path, "-m", "backend=onnx", "dtype=int8,uint8")
    assert result.returncode == 0, result.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("resnet8ptq")
    (parent,) = client.search_runs([experiment.experiment_id], "tags.sweep = 'true'")
    sweep_dir = Path(parent.data.tags["sweep_dir"])
    assert sweep_dir.parent.parent == tmp_path / "runs" / "multirun"
    assert {p.name for p in sweep_dir.iterdir()} >= REPORT_FILES
    logged = {Path(a.path).name for a in client.list_artifacts(parent.info.run_id, report.ARTIFACT_DIR)}
    assert logged == REPORT_FILES
    text = (sweep_dir / "report.md").read_text()
    assert "| onnx fp32 | onnx | fp32 | float32/float32 |" in text
    assert "onnx int8 minmax" in text and "onnx uint8 minmax" in text
    assert "**Best accuracy**: onnx" in text and "## Failed runs (0)" in text
