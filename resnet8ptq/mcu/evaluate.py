"""A TFLite model on the microcontroller path: every test image (or the first `mcu.images`) in TensorFlow
Lite Micro, compared image by image with LiteRT's reference kernels; its tensor arena and flash; the boards
it fits; Vela's NPU estimate.

TFLM's outputs are cached by the model's sha256 (with the TFLM version and the images' digest): the same
model bytes are run once, however many runs or sweeps evaluate them.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from resnet8ptq.backends.tflite.flatbuffer import read
from resnet8ptq.backends.tflite.litert_runner import dequantize, quantize
from resnet8ptq.errors import DataError
from resnet8ptq.evaluate import Evaluated, subset_accuracy
from resnet8ptq.hardware import usable_cores
from resnet8ptq.mcu import tflm, vela
from resnet8ptq.mcu.config import KIB, Board, McuConfig
from resnet8ptq.mcu.divergence import Divergence, locate
from resnet8ptq.mcu.memory import Planned, peak_live_bytes, planned_tensors
from resnet8ptq.metrics import TOP1, Metric
from resnet8ptq.spec import EvaluationImages

log = logging.getLogger(__name__)

CACHE_SUBDIR = "mcu"


@dataclass(frozen=True)
class BoardFit:
    """Whether a model fits a board: RAM for the arena plus the runtime allowance, flash for the model plus
    the runtime allowance (bytes)."""

    name: str
    board: Board
    ram_bytes: int
    flash_bytes: int

    @property
    def fits(self) -> bool:
        return self.ram_bytes <= self.board.ram_kib * KIB and self.flash_bytes <= self.board.flash_kib * KIB

    def verdict(self) -> str:
        """E.g. ``fits: RAM 70.7 of 640 KiB, flash 226.6 of 2048 KiB``, or ``no: RAM 70.7 KiB > 32 KiB``."""
        ram, flash = self.ram_bytes / KIB, self.flash_bytes / KIB
        if self.fits:
            board = self.board
            return (
                f"fits: RAM {ram:.1f} of {board.ram_kib:g} KiB, flash {flash:.1f} of {board.flash_kib:g} KiB"
            )
        short = []
        if self.ram_bytes > self.board.ram_kib * KIB:
            short.append(f"RAM {ram:.1f} KiB > {self.board.ram_kib:g} KiB")
        if self.flash_bytes > self.board.flash_kib * KIB:
            short.append(f"flash {flash:.1f} KiB > {self.board.flash_kib:g} KiB")
        return "no: " + ", ".join(short)


def board_fits(arena_bytes: int, flash_bytes: int, settings: McuConfig) -> list[BoardFit]:
    """Each of the configured boards checked against the model's arena and flash plus the allowances."""
    ram = arena_bytes + round(settings.runtime_ram_kib * KIB)
    flash = flash_bytes + round(settings.runtime_flash_kib * KIB)
    return [BoardFit(name, board, ram, flash) for name, board in settings.boards.items()]


@dataclass(frozen=True)
class McuResult:
    """A model's microcontroller path: TFLM's predictions and how they compare with LiteRT's reference
    kernels, the arena, the flash, the board fits and the NPU estimate (None: not asked for or failed)."""

    labels: np.ndarray
    predictions: np.ndarray
    reference_predictions: np.ndarray
    differing_outputs: int  # images whose output tensor differs from the reference kernels' in any value
    divergence: Divergence | None  # where the kernels part, on some of those images (None: none differ)
    perf_subset: np.ndarray
    arena: tflm.Arena
    planned: list[Planned]
    flash_bytes: int
    kernels: str  # the TFLM kernels (builtin ops) the model needs, with their counts
    fits: list[BoardFit]
    npu: vela.NpuEstimate | None
    npu_error: str | None
    seconds: float
    metric: Metric = TOP1
    test_images: int = 0  # the test set's size: more than len(labels) where `mcu.images` cut it

    @property
    def accuracy(self) -> float:
        """TFLM's score by the model's metric (top-1 accuracy, AUC)."""
        return self.metric.value(self.predictions, self.labels)

    @property
    def differing_predictions(self) -> int:
        return int(np.sum(~self.metric.agree(self.predictions, self.reference_predictions)))

    @property
    def cut(self) -> bool:
        """Whether TFLM ran only the first `mcu.images` of the test images."""
        return len(self.labels) < self.test_images

    @property
    def reference_accuracy(self) -> float:
        """The reference kernels' score on the images TFLM ran."""
        return self.metric.value(self.reference_predictions, self.labels)

    def comparison(self) -> str:
        """How TFLM's outputs compare with the reference kernels', in words."""
        n = len(self.labels)
        which = f"the first {n} of {self.test_images} test images" if self.cut else f"{n} images"
        if self.differing_outputs == 0:
            return f"identical: TFLM and LiteRT's reference kernels give the same output tensors ({which})"
        return (
            f"{self.differing_outputs} of {n} output tensors differ from LiteRT's reference kernels', "
            f"{self.differing_predictions} predictions" + (f" ({which})" if self.cut else "")
        )

    def metrics(self) -> dict[str, float]:
        metrics = {
            f"{self.metric.key}_mcu": self.accuracy,
            "mcu_differing_predictions": self.differing_predictions,
            **(
                {"accuracy_mcu_perf_subset": subset_accuracy(self.predictions, self.labels, self.perf_subset)}
                if self.perf_subset.size
                else {}
            ),
            "mcu_differing_outputs": self.differing_outputs,
            "mcu_images": len(self.labels),
            **({f"{self.metric.key}_mcu_reference": self.reference_accuracy} if self.cut else {}),
            "mcu_arena_bytes": self.arena.recorded,
            "mcu_arena_smallest_bytes": self.arena.smallest,
            "mcu_arena_head_bytes": self.arena.head,
            "mcu_tensors_peak_bytes": peak_live_bytes(self.planned),  # a lower bound of the head
            "mcu_flash_bytes": self.flash_bytes,
            "mcu_boards_fit": sum(fit.fits for fit in self.fits),
            "mcu_seconds": self.seconds,
        }
        return metrics | (self.npu.metrics() if self.npu else {})

    def tags(self) -> dict[str, str]:
        tags = {
            "mcu.runtime": f"tflite-micro {tflm.version()}",
            "mcu.kernels": self.kernels,
            "mcu.vs_reference": self.comparison(),
            **({"mcu.divergence": self.divergence.summary()} if self.divergence else {}),
            "mcu.fits": ",".join(fit.name for fit in self.fits if fit.fits) or "none",
            **{f"mcu.board.{fit.name}": fit.verdict() for fit in self.fits},
        }
        if self.npu:
            tags |= self.npu.tags()
        elif self.npu_error:
            tags["npu.estimate"] = f"failed: {self.npu_error}"
        return tags


def evaluate_mcu(
    evaluated: Evaluated,
    settings: McuConfig,
    data: EvaluationImages,
    cache_dir: Path,
    workers: int | None = None,
) -> McuResult:
    """Run the .tflite model of ``evaluated`` in TFLM on the test images (NHWC float32, quantized to its input
    type as TFLite's QUANTIZE op does) and compare with its reference outputs (LiteRT's reference kernels,
    dequantized the same way); measure its arena and flash, check the boards, ask Vela for its NPU
    estimate."""
    start = time.perf_counter()
    path, reference = evaluated.path, evaluated.reference
    desc = f"{evaluated.name}: TFLite Micro"
    images, labels, perf_subset = data.test_images, data.test_labels, data.perf_subset
    count = len(images) if settings.images is None else min(settings.images, len(images))
    metric = data.metric.first(count)
    if count < len(images):  # `mcu.images`: the first N; MLPerf's performance subset is then not whole
        images, labels, perf_subset = images[:count], labels[:count], np.zeros(0, np.int64)
        shapes = tuple(images.shape[1:]), tuple(np.shape(reference.probabilities)[1:])
        refused = metric.check(*shapes, np.asarray(labels), evaluated.name)
        if refused:
            raise DataError(f"mcu.images={count}: {refused}. Raise mcu.images, or set it to null (all).")
    reference_outputs = np.asarray(reference.probabilities)[:count]
    model = Path(path).read_bytes()
    source, sink = tflm.io(model)
    inputs = quantize(images, source.scale, source.zero_point, source.dtype) if source.scale else images
    raw = cached_outputs(model, inputs, Path(cache_dir), workers or usable_cores(), desc)
    outputs = dequantize(raw, sink.scale, sink.zero_point) if sink.scale else raw.astype(np.float32)
    differs = np.flatnonzero(np.any(outputs != reference_outputs, axis=1))
    divergence = locate(path, images[differs]) if len(differs) else None
    arena = tflm.measure_arena(model, inputs[:1])
    if not arena.agrees:
        log.warning(
            "%s: TFLM's recorded arena (%d bytes) and the smallest that runs (%d) differ by over %d bytes",
            path.name,
            arena.recorded,
            arena.smallest,
            tflm.ARENA_AGREEMENT_BYTES,
        )
    flatbuffer = read(path)
    npu, npu_error = None, None
    if settings.npu is not None:
        try:
            npu = vela.estimate(path, settings.npu)
        except RuntimeError as err:
            npu_error = str(err).splitlines()[0]
            log.warning("%s", err)
    return McuResult(
        labels=np.asarray(labels),
        predictions=metric.per_sample(outputs, images),
        reference_predictions=np.asarray(reference.predictions)[:count],
        differing_outputs=len(differs),
        divergence=divergence,
        perf_subset=np.asarray(perf_subset),
        arena=arena,
        planned=planned_tensors(flatbuffer),
        flash_bytes=len(model),
        kernels=", ".join(f"{op} x{n}" for op, n in flatbuffer.op_counts().items()),
        fits=board_fits(arena.recorded, len(model), settings),
        npu=npu,
        npu_error=npu_error,
        seconds=time.perf_counter() - start,
        metric=metric,
        test_images=len(data.test_images),
    )


def cached_outputs(model: bytes, inputs: np.ndarray, cache_dir: Path, workers: int, desc: str) -> np.ndarray:
    """TFLM's raw outputs of ``model`` on ``inputs``, from the cache when these bytes ran on these inputs with
    this TFLM version before; written atomically (a stopped run leaves no partial file)."""
    key = hashlib.sha256(model).hexdigest()[:16]
    digest = hashlib.sha256(np.ascontiguousarray(inputs).tobytes()).hexdigest()[:16]
    path = cache_dir / CACHE_SUBDIR / f"{key}-tflm{tflm.version()}-{digest}.npy"
    if path.is_file():
        log.info("%s: outputs read from the cache (%s)", desc, path)
        return np.load(path)
    outputs = tflm.run(model, inputs, workers, desc)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.partial")
    with partial.open("wb") as file:
        np.save(file, outputs)
    partial.replace(path)
    return outputs


def planned_table(planned: list[Planned]) -> list[dict[str, object]]:
    """The planned tensors as rows for ``arena_tensors.csv``."""
    return [
        {
            "tensor": t.name,
            "dtype": t.dtype,
            "shape": "x".join(map(str, t.shape)),
            "bytes": t.bytes,
            "first_op": t.first_op,
            "last_op": t.last_op,
        }
        for t in planned
    ]
