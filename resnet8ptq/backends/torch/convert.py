"""The canonical ONNX model as a torch.export program: onnx2torch conversion, export, save, load, predict."""

from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import fx

from resnet8ptq.backends.base import Predictor

PREDICT_BATCH = 100
"""Images per forward pass in a predictor. At 500, eager torch's activations (31-37 MB each) came from fresh
memory mappings op after op (the C allocator returns blocks that large to the system): measured on AMD EPYC
Zen 4 over 5,000 images, FP32 eager 245,712 minor page faults and 1.7 s of system time at 500 against 67 at
100 (2,000 vs 5,800 img/s), the q/dq reference 1.65 million against 2 (1,270 vs 2,900 img/s)."""


EXAMPLE_BATCH = 2
"""Images in the example input given to torch.export (batch 1 would specialise the batch dimension)."""


class StaticReshape(torch.nn.Module):
    """ONNX Reshape with a constant target shape (0 copies the input dimension, -1 is inferred)."""

    def __init__(self, shape: list[int]) -> None:
        super().__init__()
        self.shape = tuple(int(d) for d in shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape([x.shape[i] if d == 0 else d for i, d in enumerate(self.shape)])


def _make_reshapes_static(gm: fx.GraphModule) -> int:
    """Replace onnx2torch's OnnxReshape (a data-dependent ``torch.any(shape == 0)`` check that breaks
    torch.export) by :class:`StaticReshape` wherever the shape is a constant. Returns the count replaced."""
    from onnx2torch.node_converters.reshape import OnnxReshape

    replaced = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_module" or not isinstance(gm.get_submodule(node.target), OnnxReshape):
            continue
        shape_node = node.args[1]
        if not isinstance(shape_node, fx.Node) or shape_node.op != "get_attr":
            raise RuntimeError(f"Reshape {node.target}: the target shape is computed, not a constant.")
        shape = get_attr(gm, shape_node.target)
        gm.add_submodule(node.target, StaticReshape(shape.tolist()))
        node.args = (node.args[0],)
        replaced += 1
    gm.graph.eliminate_dead_code()
    gm.delete_all_unused_submodules()
    gm.recompile()
    return replaced


def get_attr(gm: fx.GraphModule, target: str) -> torch.Tensor:
    """The parameter or buffer a ``get_attr`` node of ``gm`` reads."""
    owner, _, name = target.rpartition(".")
    return getattr(gm.get_submodule(owner) if owner else gm, name)


def onnx_to_torch(model: Path | Any) -> fx.GraphModule:
    """The canonical ONNX model (a path or an ``onnx.ModelProto``) as an eval-mode torch GraphModule that
    torch.export can trace; its modules are named after the ONNX nodes."""
    import onnx
    from onnx2torch import convert

    gm = convert(onnx.load(str(model)) if isinstance(model, Path) else model).eval()
    _make_reshapes_static(gm)
    for tensor in [*gm.parameters(), *gm.buffers()]:
        tensor.data = tensor.data.contiguous()  # onnx2torch transposes Gemm weights into a view
        tensor.requires_grad_(False)
    return gm


def export(module: torch.nn.Module, example: tuple[torch.Tensor]) -> torch.export.ExportedProgram:
    """torch.export with a dynamic batch dimension."""
    batch = torch.export.Dim("batch", min=1, max=1 << 16)
    return torch.export.export(module, example, dynamic_shapes=({0: batch},))


def onnx_module(node: fx.Node) -> str | None:
    """The ONNX node a traced node comes from: the outermost onnx2torch module on its ``nn_module_stack``
    (onnx2torch names each module after its ONNX node; a split node, e.g. pad + conv, nests below it)."""
    stack = node.meta.get("nn_module_stack") or {}
    return next((path for path, _ in stack.values() if path), None)


def make_predictor(module: Any, batch_size: int = PREDICT_BATCH) -> Predictor:
    """NHWC float32 numpy → probabilities numpy, batch by batch under inference mode."""

    def predict(images: np.ndarray) -> np.ndarray:
        images = np.asarray(images, dtype=np.float32)
        outputs = []
        with torch.inference_mode():
            for start in range(0, len(images), batch_size):
                chunk = torch.from_numpy(np.ascontiguousarray(images[start : start + batch_size]))
                outputs.append(module(chunk).numpy())
        return np.concatenate(outputs) if outputs else np.zeros((0, 10), np.float32)

    return predict


def load_program(path: Path) -> torch.export.ExportedProgram:
    """Load a ``.pt2``; imports torchao's PT2E module first so the quantized ops are registered.

    A file loaded before in this process, unchanged since (same size and modification time), gives the same
    program object again: loading one takes ~1 s (deserialising its graph), and a run reads its quantized
    program twice (after saving it, then for the per-layer analysis). Callers only read the program; what
    they change is its ``.module()``, a copy of its graph.
    """
    stat = Path(path).stat()
    return _load_program(Path(path).resolve(), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _load_program(path: Path, size: int, mtime_ns: int) -> torch.export.ExportedProgram:
    import torchao.quantization.pt2e  # noqa: F401  (registers quantized_decomposed ops)

    return torch.export.load(str(path))


def load_quantized(path: str | Path) -> Predictor:
    """A predictor for a ``.pt2`` saved by :class:`TorchBackend` (FP32 or quantized)."""
    return make_predictor(load_program(Path(path)).module())


def input_shape(onnx_path: Path) -> tuple[int, ...]:
    """The model input's per-image shape (32, 32, 3), read from the ONNX graph."""
    import onnx

    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    dims = graph.input[0].type.tensor_type.shape.dim[1:]
    return tuple(int(d.dim_value) for d in dims)


def example_input(input_shape: tuple[int, ...]) -> tuple[torch.Tensor]:
    """A small self-contained example input for torch.export (never a view of a large tensor)."""
    return (torch.zeros((EXAMPLE_BATCH, *input_shape)),)


_DEBUG_META = ("stack_trace", "from_node", "nn_module_stack", "source_fn_stack", "torch_fn", "custom")


def save_program(program: torch.export.ExportedProgram, path: Path) -> torch.export.ExportedProgram:
    """Save a program and load it back: what callers run and inspect is exactly the file.

    The sample inputs and the per-node debug metadata (stack traces, provenance) are left out, for the
    FP32 and the quantized model alike, so the file size is the program and its weights. Written to a
    temporary directory beside it under its own name, then moved into place: processes of a parallel sweep
    save the FP32 program to the same cache file, and none may read another's half-written file (or leave
    one behind). The name matters: torch's archive names its top folder after the file, so a file saved
    under another name (a pid, say) has other bytes, and two runs of one configuration would differ.
    """
    program.example_inputs = None
    for node in program.graph.nodes:
        for key in _DEBUG_META:
            node.meta.pop(key, None)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=f".{path.name}.") as partial_dir:
        partial = Path(partial_dir) / path.name
        torch.export.save(program, str(partial))
        os.replace(partial, path)
    return load_program(path)
