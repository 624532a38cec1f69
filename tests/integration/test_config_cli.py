"""An unknown config choice fails before anything starts, listing the valid ones."""

from __future__ import annotations

from pathlib import Path

import resnet8ptq.config  # noqa: F401  (registers base_config)


def test_unknown_choice_lists_valid_ones(run_cli, tmp_path: Path) -> None:
    result = run_cli(tmp_path, "backend=tensorrt")
    assert result.returncode != 0
    assert "Could not find 'backend/tensorrt'" in result.stderr
    assert "Available options in 'backend'" in result.stderr
    assert "onnx" in result.stderr and "torch" in result.stderr
    assert not (tmp_path / "mlflow.db").exists()  # nothing was started
