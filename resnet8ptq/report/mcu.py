"""The report's *Deployability* section: for every quantized configuration, whether and how it runs on a
microcontroller (TFLite Micro accuracy beside the reference, flash, tensor arena, the boards it fits, the NPU
estimate), and accuracy against arena size with its Pareto front."""

from __future__ import annotations

import pandas as pd

from resnet8ptq.drawing import draw
from resnet8ptq.mcu.config import KIB
from resnet8ptq.report.analysis import pareto_front
from resnet8ptq.report.figures import tradeoff_png
from resnet8ptq.report.runs import differing_note, without_device
from resnet8ptq.report.sections import Report, Table

MCU_PNG = "report_accuracy_vs_arena.png"
NO_PATH = {
    "onnx": "no MCU path: an ONNX Runtime model (TFLite Micro runs .tflite files)",
    "torch": "no MCU path: a PyTorch program (TFLite Micro runs .tflite files)",
}


_CUT_NOTE = (
    " Where TFLite Micro ran only the first `mcu.images` test images, its cell names how many and the "
    "reference's accuracy on those same images."
)


def on_mcu_cell(row) -> str:
    """TFLM's accuracy (%); over the first `mcu.images` test images, with their count and the reference's
    accuracy on them (the row's reference column is over every test image)."""
    cell = f"{100 * row.accuracy_mcu:.2f}"
    if pd.isna(row.accuracy_mcu_reference):
        return cell
    return f"{cell} (first {int(row.mcu_images)}: reference {100 * row.accuracy_mcu_reference:.2f})"


def deployability_section(report: Report) -> list[str]:
    """One row per quantized model (device runs of one model once); the accuracy-vs-arena plot. Left out when
    no model ran on the MCU path (its rows would only say so)."""
    table = report.table[report.table["quantized"]].copy()
    if table["accuracy_mcu"].isna().all():
        return []
    table["model"] = without_device(table["label"])
    table = table.drop_duplicates("model")
    on_mcu = table[table["accuracy_mcu"].notna()]
    rows = []
    for row in table.sort_values(["backend", "model"]).itertuples():
        if pd.isna(row.accuracy_mcu):
            reason = NO_PATH.get(row.backend, "not run on the MCU path (mcu.enabled=false)")
            rows.append([row.model, f"{100 * row.accuracy:.2f}", reason, *["-"] * 5])
            continue
        npu = f"{int(row.npu_cycles):,} ({row.npu_inference_ms:.2f} ms)" if pd.notna(row.npu_cycles) else "-"
        rows.append(
            [
                row.model,
                f"{100 * row.accuracy:.2f}",
                on_mcu_cell(row),
                f"{int(row.mcu_differing_predictions)}",
                f"{row.mcu_flash_bytes / KIB:.1f}",
                f"{row.mcu_arena_bytes / KIB:.1f}",
                row.mcu_fits.replace(",", ", "),
                npu,
            ]
        )
    cut = "" if on_mcu["accuracy_mcu_reference"].isna().all() else _CUT_NOTE
    headers = [
        "model",
        "reference %",
        "TFLite Micro %",
        "predictions differ",
        "flash KiB",
        "arena KiB",
        "boards it fits",
        "NPU cycles (time)",
    ]
    section = [
        "## Deployability",
        "Each quantized model on the microcontroller path (docs/mcu.md): its accuracy in TensorFlow Lite "
        "Micro beside the reference (LiteRT's reference kernels; `predictions differ`: test images whose "
        f"class differs{differing_note(report.table)}), its flatbuffer (flash) and tensor arena (RAM) as "
        "TFLM allocates it, the boards it fits with the runtime's allowances, and Vela's NPU estimate (a "
        f"compiler's estimate, not a measurement).{cut}",
        Table(headers, rows).markdown(),
    ]
    if len(on_mcu) >= 2:
        points = on_mcu.assign(
            arena_kib=on_mcu["mcu_arena_bytes"] / KIB, accuracy_pct=100 * on_mcu["accuracy_mcu"]
        ).reset_index(drop=True)
        front = pareto_front(
            points["arena_kib"].to_numpy(), points["accuracy_pct"].to_numpy(), minimize_x=True
        )
        what = "accuracy in TFLite Micro vs tensor arena"
        section.append(f"Pareto front, {what}: **" + ", ".join(points.loc[front, "label"]) + "**.")
        path = report.out_dir / MCU_PNG
        drawing = draw(
            tradeoff_png,
            points,
            ("arena_kib", "tensor arena (KiB)"),
            front,
            path,
            f"{what} (Pareto front ringed)",
        )
        section.append(report.image(path, what, drawing))
    return section
