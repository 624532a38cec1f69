"""ONNX Runtime's calibrators, fed activations computed in float64: calibration ranges that do not depend on
the CPU's float32 kernels.

ORT's calibrators (MinMax, Entropy, Percentile, Distribution) add the tensors to calibrate to the model's
outputs (its *augmented model*) and run it in an ORT float32 session: MLAS picks its conv and GEMM kernels
by the CPU's instruction set, so the order of summation, and the last bits of every activation, can move
with the CPU. Here the calibrator's session is replaced by :class:`Float64Session`, which runs the same
augmented model in float64 (onnx2torch, the converter the torch backend uses) and rounds each output once
to float32: a value whose float64 error is far below float32's step, so what the calibrator collects (its
reductions, histograms and the ranges computed from them) is the same on every CPU bar a float32 rounding
tie, as the torch backend's float64 calibration (:func:`resnet8ptq.backends.torch.quantizer.calibrate`).

Why by hand: ORT has no float64 kernels for Conv on its CPU provider, and no public hook for the session a
calibrator runs; ``CalibraterBase.infer_session`` is the attribute its ``collect_data`` reads (onnxruntime
1.31, ``onnxruntime/quantization/calibrate.py``). :func:`use_float64` checks it is there before replacing it.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import onnx


class Float64Session:
    """Stands in for the ``onnxruntime.InferenceSession`` of an ORT calibrator: ``run`` evaluates the
    augmented model at ``path`` in float64 on ``threads`` torch threads and returns its outputs as float32
    arrays, in the model's output order (a graph input the calibrator also collects is passed through)."""

    def __init__(self, path: Path, threads: int) -> None:
        from onnx2torch import convert

        model = onnx.load(path)
        self.threads = threads
        self._inputs = [value.name for value in model.graph.input]
        self._outputs = [value.name for value in model.graph.output]
        computed = [value for value in model.graph.output if value.name not in self._inputs]
        self._computed = [value.name for value in computed]
        del model.graph.output[:]  # onnx2torch cannot return a graph input as an output
        model.graph.output.extend(computed)
        self._module = one_pass_extrema(convert(model)).double().eval()

    def get_inputs(self) -> list[SimpleNamespace]:
        return [SimpleNamespace(name=name) for name in self._inputs]

    def get_outputs(self) -> list[SimpleNamespace]:
        return [SimpleNamespace(name=name) for name in self._outputs]

    def run(self, output_names: list[str] | None, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        import torch

        from resnet8ptq.hardware import torch_threads

        args = [torch.from_numpy(np.asarray(feed[name], dtype=np.float64)) for name in self._inputs]
        with torch.no_grad(), torch_threads(self.threads):
            out = self._module(*args)
        out = out if isinstance(out, (tuple, list)) else (out,)
        values = {
            name: tensor.numpy().astype(np.float32) for name, tensor in zip(self._computed, out, strict=True)
        }
        passed = [name for name in self._outputs if name in self._inputs]
        values.update({name: np.asarray(feed[name], dtype=np.float32).copy() for name in passed})
        return [values[name] for name in output_names or self._outputs]


def one_pass_extrema(module: Any) -> Any:
    """``module`` (onnx2torch's conversion of an augmented model) with each ReduceMax/ReduceMin that keeps its
    dimensions computed in one pass over the tensor (``torch.amax``/``torch.amin``).

    Why: onnx2torch (1.5.15) reduces such a node one axis at a time with ``torch.max``/``torch.min``,
    which also compute the indices of the extrema; ORT's MinMax calibrator adds two of these nodes per
    calibrated tensor (``keepdims=1``, all axes or all but the channel's), and on ResNet8 they took half
    the calibration's time (6 of 12 s, 1,000 images, one core of the AVX2-only AMD EPYC). The extremum of a
    set of numbers is exact whatever order it is taken in, so the values are the same."""
    import torch
    from onnx2torch.node_converters.reduce import OnnxReduceStaticAxes

    class Extremum(torch.nn.Module):
        def __init__(self, largest: bool, axes: list[int] | None) -> None:
            super().__init__()
            self.reduce = torch.amax if largest else torch.amin
            self.axes = axes

        def forward(self, tensor: torch.Tensor) -> torch.Tensor:
            axes = self.axes if self.axes else list(range(tensor.dim()))
            return self.reduce(tensor, dim=axes, keepdim=True)

    for name, node in list(module.named_modules()):
        if (
            isinstance(node, OnnxReduceStaticAxes)
            and node.keepdims
            and node.operation_type in ("ReduceMax", "ReduceMin")
        ):
            parent, _, attribute = name.rpartition(".")
            setattr(
                module.get_submodule(parent),
                attribute,
                Extremum(node.operation_type == "ReduceMax", node.axes),
            )
    return module


def use_float64(calibrator: Any, threads: int) -> None:
    """Make an ORT calibrator (``onnxruntime.quantization.create_calibrator``) collect float64-computed
    activations (:class:`Float64Session`) in place of its float32 session's."""
    if not hasattr(calibrator, "infer_session") or not hasattr(calibrator, "augmented_model_path"):
        raise RuntimeError(
            f"This onnxruntime's {type(calibrator).__name__} has no infer_session/augmented_model_path: "
            "calibration in float64 cannot be set up (onnxruntime 1.31's CalibraterBase has both)"
        )
    calibrator.infer_session = Float64Session(Path(calibrator.augmented_model_path), threads)
