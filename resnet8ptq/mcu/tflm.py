"""A .tflite model in TensorFlow Lite Micro (the ``tflite-micro`` wheel's Python interpreter, which runs
TFLM's own C++ kernels, those a microcontroller build links): its outputs on every image, and the tensor
arena it needs.

TFLM's interpreter takes one image per ``invoke`` (the model's batch of 1) and runs on one core, so the images
are shared among worker processes, one interpreter each (spawned: no TensorFlow or torch in them).

The arena is measured two ways that must agree: the ``RecordingMicroAllocator``'s report after an inference
(``print_allocations()`` writes it to the process's C-level stderr, file descriptor 2, which is captured),
and the smallest arena size with which the interpreter allocates and invokes (bisection, in a child process).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from resnet8ptq.spawning import spawn_context

CHUNK = 250  # images per task of a worker process
ARENA_AGREEMENT_BYTES = 512  # largest |recorded - bisected| arena size accepted as agreeing
_TOTAL = re.compile(r"Arena allocation total (\d+) bytes")
_HEAD = re.compile(r"Arena allocation head (\d+) bytes")
_TAIL = re.compile(r"Arena allocation tail (\d+) bytes")


def version() -> str:
    return importlib.metadata.version("tflite-micro")


@contextlib.contextmanager
def captured_stderr() -> Iterator[list[str]]:
    """Capture what C/C++ code writes to file descriptor 2 (TFLM's MicroPrintf) while the block runs; the text
    is in the yielded list afterwards."""
    text: list[str] = []
    with tempfile.TemporaryFile() as sink:
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield text
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            text.append(sink.read().decode(errors="replace"))


def _interpreter(model: bytes, arena_size: int | None = None):  # -> tflite_micro.runtime.Interpreter
    from tflite_micro import runtime

    return runtime.Interpreter.from_bytes(model, arena_size=arena_size)


@dataclass(frozen=True)
class Arena:
    """The tensor arena TFLM needs for a model (bytes): the recording allocator's total, its head (the
    planned non-persistent tensors) and tail (persistent structures), the smallest size that runs, and the
    allocator's report as TFLM printed it."""

    recorded: int
    head: int
    tail: int
    smallest: int
    report: str

    @property
    def agrees(self) -> bool:
        return abs(self.recorded - self.smallest) <= ARENA_AGREEMENT_BYTES


def measure_arena(model: bytes, sample: np.ndarray) -> Arena:
    """The arena of ``model`` after one inference of ``sample`` (one model-input image, integer or float as
    the model's input tensor): the recording allocator's report, and the smallest arena that runs."""
    interpreter = _interpreter(model)
    with captured_stderr() as printed:
        interpreter.set_input(sample, 0)
        interpreter.invoke()
        interpreter.print_allocations()
    report = printed[0]
    recorded = _bytes(_TOTAL, report)
    smallest = smallest_arena(model, sample, recorded)
    return Arena(recorded, _bytes(_HEAD, report), _bytes(_TAIL, report), smallest, report.strip())


def _runs(model: bytes, sample: np.ndarray, size: int) -> bool:
    """Whether TFLM allocates and invokes ``model`` on ``sample`` in an arena of ``size`` bytes."""
    try:
        with captured_stderr():  # TFLM prints why an allocation failed
            candidate = _interpreter(model, size)
            candidate.set_input(sample, 0)
            candidate.invoke()
    except (RuntimeError, ValueError):
        return False
    return True


def smallest_arena(model: bytes, sample: np.ndarray, recorded: int) -> int:
    """The smallest arena (bytes) with which TFLM allocates and invokes ``model`` on ``sample``: doubled from
    twice the ``recorded`` total until it runs, then bisected, in a child process (:func:`_bisect`). Some of
    TFLM's kernels use a persistent buffer without checking that it was allocated, so an arena too small by
    a little crashes the interpreter (a segmentation fault: MLPerf Tiny's int8 anomaly-detection autoencoder
    between 15.2 and 16.5 KB) instead of failing; a size that crashed counts as one that does not run, and
    the search goes on in a new child."""
    low, high, grown = 1, max(recorded * 2, 4096), False
    with tempfile.TemporaryDirectory() as tmp:
        model_path, sample_path = Path(tmp) / "model.tflite", Path(tmp) / "sample.npy"
        model_path.write_bytes(model)
        np.save(sample_path, sample)
        for _ in range(64):
            command = [sys.executable, "-m", __name__, str(model_path), str(sample_path), str(low), str(high)]
            child = subprocess.run([*command, str(int(grown))], capture_output=True, text=True, check=False)
            lines = child.stdout.split()
            if child.returncode == 0 and lines[-2:-1] == ["smallest"]:
                return int(lines[-1])
            tried = [i for i, word in enumerate(lines) if word == "try"]
            if not tried:
                raise RuntimeError(f"TFLM's arena search failed: {child.stderr.strip()[-500:]}")
            phase, size, *bounds = lines[tried[-1] + 1 : tried[-1] + 5]
            if phase == "grow":  # crashed at `size`: it does not run
                low, high = int(size) + 1, int(size) * 2
            else:
                low, high, grown = int(size) + 1, int(bounds[1]), True
    raise RuntimeError("TFLM's arena search crashed 64 times")


def _bisect(model: bytes, sample: np.ndarray, low: int, high: int, grown: bool) -> None:
    """The search of :func:`smallest_arena`, in this process, each size printed before it is tried."""
    if not grown:
        while True:
            print("try grow", high, flush=True)
            if _runs(model, sample, high):
                break
            low, high = high + 1, high * 2
    while low < high:
        middle = (low + high) // 2
        print("try bisect", middle, low, high, flush=True)
        low, high = (low, middle) if _runs(model, sample, middle) else (middle + 1, high)
    print("smallest", high, flush=True)


def _bytes(pattern: re.Pattern[str], report: str) -> int:
    match = pattern.search(report)
    if match is None:
        raise RuntimeError(f"TFLM's allocation report has no {pattern.pattern!r}:\n{report}")
    return int(match.group(1))


def run(model: bytes, inputs: np.ndarray, workers: int, desc: str = "TFLite Micro") -> np.ndarray:
    """``model``'s raw output tensor for each of ``inputs`` (already in the input tensor's type), one
    ``invoke`` per image, shared among ``workers`` spawned processes (in this process inside a joblib job:
    :func:`spawn_context`)."""
    chunks = [inputs[start : start + CHUNK] for start in range(0, len(inputs), CHUNK)]
    context = spawn_context()  # None in a joblib launcher job: this process runs them all
    if workers <= 1 or len(chunks) <= 1 or context is None:
        _start_worker(model)
        return np.concatenate([_invoke_all(chunk) for chunk in tqdm(chunks, desc=desc, unit="chunk")])
    with ProcessPoolExecutor(workers, context, initializer=_start_worker, initargs=(model,)) as pool:
        outputs = list(tqdm(pool.map(_invoke_all, chunks), total=len(chunks), desc=desc, unit="chunk"))
    return np.concatenate(outputs)


_WORKER: dict[str, object] = {}


def _start_worker(model: bytes) -> None:
    _WORKER["interpreter"] = _interpreter(model)


def _invoke_all(images: np.ndarray) -> np.ndarray:
    interpreter = _WORKER["interpreter"]
    outputs = []
    for image in images:
        interpreter.set_input(image[None], 0)
        interpreter.invoke()
        outputs.append(np.array(interpreter.get_output(0)[0]))
    return np.stack(outputs)


@dataclass(frozen=True)
class Io:
    """A model input's or output's storage type and quantization (scale 0: a float tensor)."""

    dtype: np.dtype
    scale: float
    zero_point: int


def io(model: bytes) -> tuple[Io, Io]:
    """The input and the output tensor of ``model``: type, scale, zero point."""
    interpreter = _interpreter(model)

    def read(details: dict) -> Io:
        quantization = details["quantization_parameters"]
        scales, zero_points = quantization["scales"], quantization["zero_points"]
        return Io(
            np.dtype(details["dtype"]),
            float(scales[0]) if len(scales) else 0.0,
            int(zero_points[0]) if len(zero_points) else 0,
        )

    return read(interpreter.get_input_details(0)), read(interpreter.get_output_details(0))


if __name__ == "__main__":  # the arena search's child: MODEL SAMPLE LOW HIGH GROWN (smallest_arena)
    _bisect(
        Path(sys.argv[1]).read_bytes(),
        np.load(sys.argv[2]),
        int(sys.argv[3]),
        int(sys.argv[4]),
        sys.argv[5] == "1",
    )
