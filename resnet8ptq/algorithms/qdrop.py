"""QDrop (Wei et al., QDrop: Randomly Dropping Quantization for Extremely Low-bit Post-Training
Quantization, ICLR 2022): BRECQ's block reconstruction with quantization dropped at random while learning,
element by element, in the block's input and its activations (:mod:`._reconstruction`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from resnet8ptq.algorithms.brecq import Brecq, BrecqParameters


@dataclass
class QDropParameters(BrecqParameters):
    """BRECQ's, and ``drop``: the probability of keeping an element in float (the paper's 0.5)."""

    ALGORITHM: ClassVar[str] = "qdrop"
    drop: float = 0.5

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.drop < 1:
            raise ValueError(
                f"algo.qdrop_drop: expected a probability strictly between 0 and 1, got {self.drop}."
            )

    @property
    def drop_prob(self) -> float:
        return self.drop


class QDrop(Brecq):
    """``qdrop``: BRECQ with dropped quantization, in the same stage."""

    NAME = "qdrop"
    Parameters = QDropParameters
