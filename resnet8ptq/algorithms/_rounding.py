"""AdaRound's learned rounding of one weight (Nagel et al. 2020, arXiv:2004.10568), shared by `adaround`
(layer by layer) and the block reconstructions (`brecq`, `qdrop`): a rectified-sigmoid soft rounding h(V)
of every element between floor(w / scale) and the next integer, its regulariser annealing h towards 0 or 1
(beta from 20 to 2, the first 20 % of iterations without it), and the hard integers it ends at."""

from __future__ import annotations

import numpy as np
import torch

from resnet8ptq.weight_grid import WeightGrid

ZETA, GAMMA = 1.1, -0.1  # rectified sigmoid stretch (paper, eq. 23)
REGULARIZATION = 0.01  # lambda: the regulariser's weight
WARM_UP = 0.2  # the share of iterations before the regulariser starts
BETA = (20.0, 2.0)  # the regulariser's annealing, start -> end


class SoftRounding(torch.nn.Module):
    """One weight on its grid, each element rounded down or up by the learnable ``v``; in the weight's own
    (ONNX) layout. ``hard`` switches from the soft rounding h(v) to its decision h(v) >= 0.5."""

    def __init__(self, weight: np.ndarray, grid: WeightGrid) -> None:
        super().__init__()
        shape = [1] * weight.ndim
        shape[grid.axis] = -1
        self.register_buffer("scale", torch.from_numpy(grid.scale).reshape(shape))
        self.register_buffer(
            "zero_point", torch.from_numpy(grid.zero_point.astype(np.float32)).reshape(shape)
        )
        w = torch.from_numpy(np.ascontiguousarray(weight, np.float32))
        self.register_buffer("floor", torch.floor(w / self.scale))
        rest = w / self.scale - self.floor  # in [0, 1): the rounding to learn; h(v) starts there
        self.v = torch.nn.Parameter(-torch.log((ZETA - GAMMA) / (rest.clamp(0.01, 0.99) - GAMMA) - 1))
        self.register_buffer("pinned", torch.from_numpy(range_ends(weight, grid)))
        self.register_buffer("nearest", torch.round(w / self.scale) - self.floor)
        self.qmin, self.qmax = grid.qmin, grid.qmax
        self.hard = False

    def rounding(self) -> torch.Tensor:
        """h(v) in [0, 1], or its hard decision; the :func:`range_ends` at their nearest rounding."""
        soft = torch.clamp(torch.sigmoid(self.v) * (ZETA - GAMMA) + GAMMA, 0, 1)
        return torch.where(self.pinned, self.nearest, (soft >= 0.5).float() if self.hard else soft)

    def forward(self) -> torch.Tensor:
        """The weight on the grid: (clamp(floor + h + zero point) - zero point) * scale."""
        integers = torch.clamp(self.floor + self.rounding() + self.zero_point, self.qmin, self.qmax)
        return (integers - self.zero_point) * self.scale

    def regularizer(self, beta: float) -> torch.Tensor:
        """sum(1 - |2h - 1|^beta): zero once every element has decided."""
        return (1 - (2 * self.rounding() - 1).abs().pow(beta)).sum()

    def integers(self) -> np.ndarray:
        """The hard decision's integers (int32), as the backends store them."""
        with torch.no_grad():
            hard = (self.rounding() >= 0.5).float()
            values = torch.clamp(self.floor + hard + self.zero_point, self.qmin, self.qmax)
        return values.numpy().astype(np.int32)


def range_ends(weight: np.ndarray, grid: WeightGrid) -> np.ndarray:
    """Where ``weight`` holds its channel's (or, per tensor, its own) smallest or largest value: the
    elements the grid's range is computed from. They keep their nearest rounding, so that a backend that
    computes the grid again from the learned weights (ONNX Runtime and PyTorch do) finds this grid and
    stores exactly the learned integers; a learned end would shrink the range, and with it every
    integer of its channel."""
    if len(grid.scale) == 1:
        return (weight == weight.min()) | (weight == weight.max())
    others = tuple(d for d in range(weight.ndim) if d != grid.axis)
    return (weight == weight.min(axis=others, keepdims=True)) | (
        weight == weight.max(axis=others, keepdims=True)
    )


def regularization(step: int, iterations: int) -> float | None:
    """The regulariser's beta at ``step`` (None during the warm-up, when it is off)."""
    warm_up = int(WARM_UP * iterations)
    if step < warm_up:
        return None
    start, end = BETA
    return start + (end - start) * (step - warm_up) / max(iterations - warm_up, 1)
