"""Stage ``layers`` (``layer_analysis``): the quantizer's own error per layer, the quantized model against
the FP32 model it was given (after the algorithms) on :data:`LAYER_ERROR_IMAGES` calibration images, timed;
once per quantization (kept on it, and logged with it by the ``quantize`` stage)."""

from __future__ import annotations

import time

from resnet8ptq.inputs import RunInputs
from resnet8ptq.resolve import Plan
from resnet8ptq.spec import LayerError
from resnet8ptq.stages import RunRecord, Stage

LAYER_ERROR_IMAGES = 200  # calibration images used for the per-layer SQNR analysis


class LayersStage(Stage):
    name = "layers"
    order = 30

    def enabled(self, plan: Plan) -> bool:
        return bool(plan.cfg.layer_analysis)

    def run(self, inputs: RunInputs, record: RunRecord) -> list[LayerError]:
        plan, made = record.plan, record["quantize"].made
        if made.layer_errors is None:
            start = time.perf_counter()
            given = (
                record["fp32"].baseline.model
                if not plan.algo.steps
                else plan.backend.load_fp32(made.prepared.onnx_path, record.output_dir / "algo")
            )
            images = inputs.calibration_images[:LAYER_ERROR_IMAGES]
            made.layer_errors = plan.backend.layer_errors(given, made.quantized, images)
            made.quantized.metrics["layer_analysis_seconds"] = time.perf_counter() - start
        return made.layer_errors

    def log(self, inputs: RunInputs, record: RunRecord, result: list[LayerError]) -> None:
        """Nothing more: the errors are part of the quantization's record (``quantize``)."""


STAGE = LayersStage()
