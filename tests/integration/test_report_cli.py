"""The comparison report after a real CLI sweep (the shared three-toolchain sweep): written beside the sweep
and logged to its parent run, with every toolchain, MLPerf's model and the Deployability section."""

from __future__ import annotations

from pathlib import Path

from resnet8ptq.report import figures
from resnet8ptq.report import writer as report
from resnet8ptq.report.mcu import MCU_PNG
from tests.integration.conftest import Sweeps
from tests.unit.test_report import REPORT_FILES


def test_real_sweep_writes_the_report(sweeps: Sweeps) -> None:
    parent, client = sweeps.first, sweeps.client
    sweep_dir = Path(parent.data.tags["sweep_dir"])
    assert sweep_dir.parent.parent == sweeps.workdir / "runs" / "multirun"
    # Every quantized run is on the integer device, its chip costed: accuracy against the chip's energy and
    # area, and each chip's energy by component, in place of the model file's size and this CPU's speed.
    chips = {figures.ENERGY_PNG, figures.AREA_PNG, figures.CHIP_ENERGY_PNG}
    files = REPORT_FILES - {figures.SIZE_PNG, figures.THROUGHPUT_PNG} | chips | {MCU_PNG}  # MCU: arena plot
    assert {p.name for p in sweep_dir.iterdir()} >= files
    logged = {Path(a.path).name for a in client.list_artifacts(parent.info.run_id, report.ARTIFACT_DIR)}
    assert logged == files
    text = (sweep_dir / "report.md").read_text()
    for backend in ("onnx", "torch", "tflite"):
        assert f"| {backend} fp32 | {backend} | fp32 | float32/float32 |" in text
    assert "**Best accuracy**: " in text and "## Failed runs (0)" in text
    assert "**Least energy on the chip**: " in text and "**Smallest model**" not in text
    chip = text.split("## The chip")[1].split("\n## ")[0]
    assert "**Cheapest chip by energy within 1 point(s) of the integer device**: " in chip
    deployability = text.split("## Deployability")[1].split("\n## ")[0]
    assert "no MCU path: an ONNX Runtime model" in deployability
    assert "no MCU path: a PyTorch program" in deployability
    assert "| mlperf int8 (published) | 87.07 | " in deployability
