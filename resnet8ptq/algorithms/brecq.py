"""BRECQ (Li et al., BRECQ: Pushing the Limit of Post-Training Quantization by Block Reconstruction, ICLR
2021): block by block, the weights' rounding and the activations' steps learned together, with the
activations quantized in the loop (:mod:`._reconstruction`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from resnet8ptq.algorithms.base import Algorithm, Context

if TYPE_CHECKING:
    import onnx


@dataclass
class BrecqParameters:
    """``iterations``: Adam steps per block; ``batch_size``: calibration images per step."""

    ALGORITHM: ClassVar[str] = "brecq"
    iterations: int = 2000
    batch_size: int = 32

    def __post_init__(self) -> None:
        if self.iterations < 1 or self.batch_size < 1:
            raise ValueError(
                f"algo.{self.ALGORITHM}_iterations and algo.{self.ALGORITHM}_batch_size: expected positive "
                f"numbers, got {self.iterations} and {self.batch_size}."
            )

    @property
    def drop_prob(self) -> float:
        """QDrop's probability of keeping an activation in float while learning (BRECQ: none)."""
        return 0.0


class Brecq(Algorithm):
    """``brecq``: an alternative to ``adaround`` in the weight-rounding stage that also learns the
    activations' ranges, which the ONNX Runtime and PyTorch backends then store."""

    NAME = "brecq"
    STAGE = 20
    DEVICE_AWARE = True
    Parameters = BrecqParameters

    def apply(self, model: onnx.ModelProto, context: Context) -> dict[str, str]:
        from resnet8ptq.algorithms._reconstruction import reconstruct

        settings = self.parameters
        learned = reconstruct(model, context, settings.iterations, settings.batch_size, settings.drop_prob)
        context.ranges.update(learned.ranges)
        context.adc_steps.update(learned.adc_steps)
        blocks = " | ".join(
            "+".join(layer.split("/")[1] for layer in block.layers) for block in learned.blocks
        )
        tags = {
            f"{self.NAME}_flipped": f"{np.mean(list(learned.flipped.values())):.4f}",
            f"{self.NAME}_blocks": blocks,
            f"{self.NAME}_activations": str(len(learned.ranges)),
        }
        if learned.adc_steps:  # learned against a crossbar: how many ADC steps
            tags[f"{self.NAME}_adcs"] = str(sum(len(steps.steps) for steps in learned.adc_steps.values()))
        return tags
