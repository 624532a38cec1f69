"""Where TFLM and LiteRT's reference kernels part: both interpreters keep every intermediate tensor, and the
ops of the model are compared in order on images whose outputs differ. The first op whose output differs is
the kernel whose arithmetic differs (the ops before it agree bit for bit)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from resnet8ptq.backends.tflite.flatbuffer import read
from resnet8ptq.backends.tflite.litert_runner import TFLiteRunner, quantize

IMAGES = 20  # differing images examined (each is one invoke of each interpreter)


@dataclass(frozen=True)
class Divergence:
    """On the images examined: how often each op (``"index OP"``) was the first to differ, and the largest
    difference of each differing op's output (in units of its last bit)."""

    images: int
    first: Counter
    largest_lsb: dict[str, int]

    def summary(self) -> str:
        """E.g. ``first differs at op 14 FULLY_CONNECTED (20 of 20 images, by <= 1 LSB); later: 15 SOFTMAX
        (<= 7 LSB); every op before it is bit-identical``."""
        if not self.first:
            return "no differing image examined"
        parts = [
            f"op {op} ({count} of {self.images} images, by <= {self.largest_lsb[op]} LSB)"
            for op, count in self.first.most_common()
        ]
        later = [f"{op} (<= {lsb} LSB)" for op, lsb in self.largest_lsb.items() if op not in self.first]
        text = "first differs at " + "; ".join(parts)
        return text + (f"; later: {', '.join(later)}" if later else "") + "; every op before is bit-identical"


def locate(path: Path, images: np.ndarray) -> Divergence:
    """Compare TFLM with LiteRT's reference kernels op by op on ``images`` (float, model input)."""
    from tflite_micro import runtime

    model = read(path)
    reference = TFLiteRunner(path, threads=1, reference=True, preserve_all_tensors=True)
    litert = reference.interpreter
    source = litert.get_input_details()[0]
    micro = runtime.Interpreter.from_bytes(
        Path(path).read_bytes(), intrepreter_config=runtime.InterpreterConfig.kPreserveAllTensors
    )
    first: Counter = Counter()
    largest: dict[str, int] = {}
    for image in images[:IMAGES]:
        batch = image[None]
        reference.invoke(batch)
        micro.set_input(quantize(batch, *source["quantization"], source["dtype"]), 0)
        micro.invoke()
        found = None
        for index, (op, _, outputs) in enumerate(model.ops):
            expected = litert.get_tensor(outputs[0])
            actual = micro.GetTensor(outputs[0], 0)["tensor_data"].reshape(expected.shape)
            if np.array_equal(expected, actual):
                continue
            name = f"{index} {op}"
            gap = int(np.abs(expected.astype(np.int64) - actual.astype(np.int64)).max())
            largest[name] = max(largest.get(name, 0), gap)
            found = found or name
        if found:
            first[found] += 1
    return Divergence(min(len(images), IMAGES), first, largest)
