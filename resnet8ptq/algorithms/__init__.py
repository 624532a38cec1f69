"""The `algo` config group: post-training algorithms applied to the canonical FP32 ONNX model before a backend
quantizes it, so every backend inherits them (`conf/algo/*.yaml`).

Steps run in the order of :data:`STEPS`: cross-layer equalization (:mod:`.cle`), adaptive rounding
(:mod:`.adaround`), then empirical bias correction (:mod:`.bias_correction`), which must see the final
weights. Written here, not taken from NNCF,
AIMET or Quark: see the README ("PTQ algorithms") for why.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from resnet8ptq.spec import QuantSpec

STEPS = ("cle", "adaround", "bias_correction")


@dataclass
class AlgoConfig:
    """``steps``: the algorithms to apply, a subset of :data:`STEPS` in that order (empty: none);
    ``adaround_iterations``/``adaround_batch_size``: Adam steps per layer and images per step."""

    steps: list[str] = field(default_factory=list)
    adaround_iterations: int = 1000
    adaround_batch_size: int = 32

    def __post_init__(self) -> None:
        unknown = [step for step in self.steps if step not in STEPS]
        if unknown:
            raise ValueError(f"algo.steps: unknown {unknown}; expected some of {', '.join(STEPS)}.")
        if list(self.steps) != sorted(set(self.steps), key=STEPS.index):
            order = ", ".join(STEPS)
            raise ValueError(f"algo.steps={list(self.steps)}: each at most once, in the order {order}.")
        if self.adaround_iterations < 1 or self.adaround_batch_size < 1:
            raise ValueError(
                "algo.adaround_iterations and algo.adaround_batch_size: expected positive numbers."
            )


@dataclass(frozen=True)
class Prepared:
    """The FP32 model the backend quantizes, the algorithms' seconds, and what they did (run tags)."""

    onnx_path: Path
    seconds: float = 0.0
    tags: dict[str, str] = field(default_factory=dict)


def prepare(
    algo: AlgoConfig,
    onnx_path: Path,
    calibration_images: np.ndarray,
    spec: QuantSpec,
    workdir: Path,
    seed: int = 0,
) -> Prepared:
    """Apply ``algo``'s steps to the model at ``onnx_path``, saved as ``workdir/model_fp32_algo.onnx``; the
    model itself when there are none. ``seed``: AdaRound's batch sampling."""
    if not algo.steps:
        return Prepared(onnx_path)
    import onnx

    from resnet8ptq.model import save_onnx

    start = time.perf_counter()
    model = onnx.load(onnx_path)
    tags = {}
    if "cle" in algo.steps:
        from resnet8ptq.algorithms.cle import equalize

        tags["algo.cle_pairs"] = "; ".join(equalize(model)) or "none found"
    if "adaround" in algo.steps:
        from resnet8ptq.algorithms.adaround import adaround

        flipped = adaround(
            model, calibration_images, spec, algo.adaround_iterations, algo.adaround_batch_size, seed
        )
        tags["algo.adaround_flipped"] = f"{np.mean(list(flipped.values())):.4f}"
    if "bias_correction" in algo.steps:
        from resnet8ptq.algorithms.bias_correction import correct_biases

        moved = correct_biases(model, calibration_images, spec)
        tags["algo.bias_correction_layers"] = str(len(moved))
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "model_fp32_algo.onnx"
    save_onnx(model, path)
    return Prepared(path, time.perf_counter() - start, tags)
