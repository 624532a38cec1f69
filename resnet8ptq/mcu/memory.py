"""Where a .tflite model's tensor arena goes: each computed tensor's size and lifetime (the ops from the one
that writes it to the last that reads it), read from the flatbuffer, and the bytes live at each op. TFLM's
memory planner packs these tensors into the arena's head; their peak is a lower bound of it (the planner may
leave gaps), which the measured arena (:mod:`.tflm`) is checked against."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from resnet8ptq.backends.tflite.flatbuffer import TFLiteModel


@dataclass(frozen=True)
class Planned:
    """A tensor the arena holds while ops run: its name, type, shape, bytes and its first and last op."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    bytes: int
    first_op: int
    last_op: int


def planned_tensors(model: TFLiteModel) -> list[Planned]:
    """Every non-constant tensor (the input, op outputs) with its lifetime, largest first."""
    first: dict[int, int] = {index: 0 for index in model.inputs}
    last: dict[int, int] = {}
    for position, (_, inputs, outputs) in enumerate(model.ops):
        for index in outputs:
            first.setdefault(index, position)
            last[index] = max(last.get(index, position), position)
        for index in inputs:
            if index in first:
                last[index] = position
    planned = []
    for index, start in first.items():
        tensor = model.tensors[index]
        size = int(np.prod(tensor.shape)) * np.dtype(tensor.dtype).itemsize
        planned.append(Planned(tensor.name, tensor.dtype, tensor.shape, size, start, last.get(index, start)))
    return sorted(planned, key=lambda tensor: (-tensor.bytes, tensor.first_op))


def peak_live_bytes(planned: list[Planned]) -> int:
    """The most bytes of planned tensors alive during any one op."""
    ops = max((tensor.last_op for tensor in planned), default=-1) + 1
    live = [sum(t.bytes for t in planned if t.first_op <= op <= t.last_op) for op in range(ops)]
    return max(live, default=0)
