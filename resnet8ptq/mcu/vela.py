"""Arm's Vela compiler (``ethos-u-vela``) on a .tflite model for an Ethos-U NPU: its estimate of cycles,
inference time, SRAM and flash, read from the summary CSV it writes. These are the compiler's performance
model's figures, not a measurement on silicon.

Vela runs in a child process (its command line, ``vela.main``): it prints its tables to stdout and sets up
its own logging.
"""

from __future__ import annotations

import csv
import importlib.metadata
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from resnet8ptq.mcu.config import KIB


@dataclass(frozen=True)
class NpuEstimate:
    """What Vela reports for one model on one accelerator configuration."""

    accelerator: str  # e.g. Ethos_U55_128
    system: str  # Vela's system configuration (clock, memories)
    clock_mhz: float
    cycles: int  # cycles_total: NPU cycles and memory accesses that do not overlap them
    inference_ms: float  # at clock_mhz
    sram_bytes: int
    flash_bytes: int  # off-chip and on-chip flash: the compiled weights and command stream
    macs: int
    npu_ops: int
    cpu_ops: int  # ops Vela leaves to the Cortex-M (TFLM runs them)

    def metrics(self) -> dict[str, float]:
        return {
            "npu_cycles": self.cycles,
            "npu_inference_ms": self.inference_ms,
            "npu_sram_bytes": self.sram_bytes,
            "npu_flash_bytes": self.flash_bytes,
            "npu_macs": self.macs,
            "npu_cpu_ops": self.cpu_ops,
        }

    def tags(self) -> dict[str, str]:
        return {
            "npu.accelerator": self.accelerator,
            "npu.system_config": self.system,
            "npu.clock_mhz": f"{self.clock_mhz:g}",
            "npu.estimate": f"ethos-u-vela {version()} (compiler estimate, not a measurement)",
        }


def version() -> str:
    return importlib.metadata.version("ethos-u-vela")


def estimate(path: Path, accelerator: str) -> NpuEstimate:
    """Compile ``path`` with Vela for ``accelerator`` (e.g. ``ethos-u55-128``) and read its summary."""
    with tempfile.TemporaryDirectory(prefix="vela-") as out:
        command = [
            sys.executable,
            "-c",
            "import sys; from ethosu.vela.vela import main; sys.exit(main())",
            str(path),
            "--accelerator-config",
            accelerator,
            "--output-dir",
            out,
        ]
        done = subprocess.run(command, capture_output=True, text=True)
        summaries = sorted(Path(out).glob("*_summary_*.csv"))
        if done.returncode != 0 or not summaries:
            raise RuntimeError(f"Vela failed on {path.name} ({accelerator}):\n{done.stderr[-2000:]}")
        with summaries[0].open() as file:
            row = next(csv.DictReader(file))
    clock = float(row["core_clock"])
    cycles = int(float(row["cycles_total"]))
    flash = float(row["off_chip_flash_memory_used"]) + float(row["on_chip_flash_memory_used"])
    cpu_ops, npu_ops = _operator_counts(done.stdout)
    return NpuEstimate(
        accelerator=row["accelerator_configuration"],
        system=row["system_config"],
        clock_mhz=clock / 1e6,
        cycles=cycles,
        inference_ms=1e3 * cycles / clock,
        sram_bytes=round(float(row["sram_memory_used"]) * KIB),
        flash_bytes=round(flash * KIB),
        macs=int(float(row["nn_macs"])),
        npu_ops=npu_ops,
        cpu_ops=cpu_ops,
    )


def _operator_counts(stdout: str) -> tuple[int, int]:
    """(CPU operators, NPU operators) from Vela's network summary."""
    counts = {}
    for line in stdout.splitlines():
        for kind in ("CPU", "NPU"):
            if line.startswith(f"{kind} operators = "):
                counts[kind] = int(line.split("=")[1].split()[0])
    return counts.get("CPU", 0), counts.get("NPU", 0)
