"""Reading a saved quantized program: its quantize/dequantize ops, effective dtypes, stored weights, size."""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch import fx

from resnet8ptq.backends.torch.convert import get_attr
from resnet8ptq.dtype import bits_used
from resnet8ptq.spec import LayerPrecision


def drop_unused_attributes(gm: fx.GraphModule) -> int:
    """Delete parameters/buffers no node reads (convert_pt2e leaves the float weights behind, and
    torch.export would save them: the file would hold the FP32 model too). Returns the count deleted."""
    used = {node.target for node in gm.graph.nodes if node.op == "get_attr"}
    names = [n for n, _ in gm.named_parameters()] + [n for n, _ in gm.named_buffers()]
    dropped = 0
    for name in names:
        if name not in used:
            owner, _, attr = name.rpartition(".")
            delattr(gm.get_submodule(owner) if owner else gm, attr)
            dropped += 1
    return dropped


def qdq_op(node: fx.Node) -> str | None:
    """``quantize_per_tensor``, ``dequantize_per_channel``, ... for a quantized_decomposed op, else None."""
    target = node.target
    if node.op == "call_function" and getattr(target, "namespace", None) == "quantized_decomposed":
        return target.overloadpacket.__name__
    return None


def qdq_counts(gm: fx.GraphModule) -> Counter[str]:
    """How many quantize/dequantize ops of each kind the graph holds."""
    return Counter(op for node in gm.graph.nodes if (op := qdq_op(node)))


def _is_constant_input(program: torch.export.ExportedProgram, node: fx.Node) -> bool:
    """True for a placeholder that is a parameter/buffer/constant rather than the user input."""
    return node.op == "placeholder" and node.name not in program.graph_signature.user_inputs


def _dtype_arg(node: fx.Node) -> str:
    dtype = node.kwargs.get("dtype", node.args[-1])
    if not isinstance(dtype, torch.dtype):
        raise RuntimeError(f"{node.name}: no dtype argument in {node.args}.")
    return str(dtype).removeprefix("torch.")


def weight_dequantizes(program: torch.export.ExportedProgram) -> list[fx.Node]:
    """Dequantize ops whose input is a stored (folded) integer constant: the quantized weights."""
    return [
        node
        for node in program.graph.nodes
        if (op := qdq_op(node)) and op.startswith("dequantize") and _is_constant_input(program, node.args[0])
    ]


def _stored_tensor(program: torch.export.ExportedProgram, node: fx.Node) -> torch.Tensor:
    """The parameter/buffer/constant a placeholder of the program stands for."""
    sig = program.graph_signature
    for mapping in (sig.inputs_to_parameters, sig.inputs_to_buffers):
        if node.name in mapping:
            return program.state_dict[mapping[node.name]]
    return program.constants[sig.inputs_to_lifted_tensor_constants[node.name]]


def quantized_weights(program: torch.export.ExportedProgram) -> list[torch.Tensor]:
    """The stored integer weights of a quantized program (the inputs of its weight dequantize ops)."""
    return [_stored_tensor(program, node.args[0]) for node in weight_dequantizes(program)]


def weight_granularity(program: torch.export.ExportedProgram) -> str:
    """Whether some weight has distinct scales across channels ("per-channel") or none ("per-tensor")."""
    for node in weight_dequantizes(program):
        scale = node.args[1]
        if isinstance(scale, fx.Node) and _stored_tensor(program, scale).unique().numel() > 1:
            return "per-channel"
    return "per-tensor"


WEIGHTED_OPS = (torch.ops.aten.conv2d.default, torch.ops.aten.linear.default)
"""The ops whose second argument is a quantized weight."""


def layer_precision(
    program: torch.export.ExportedProgram, layer_nodes: dict[str, tuple[str, str]]
) -> list[LayerPrecision]:
    """Every quantized layer of a saved program as stored, named by ``layer_nodes`` (node name -> (kind,
    layer), :meth:`OrtAlignedX86Quantizer.layer_nodes`): activations by the dtype and integer range their
    ``quantize_per_tensor`` clamps to, weights by their stored integers (dtype, fewest bits holding them)."""
    found: dict[tuple[str, str], LayerPrecision] = {}
    for node in program.graph.nodes:
        if node.name not in layer_nodes:
            continue
        kind, layer = layer_nodes[node.name]
        if kind == "activation":
            low, high = node.args[3], node.args[4]
            precision = LayerPrecision(layer, kind, _dtype_arg(node), bits_used(low, high, signed=low < 0))
        else:
            dequantize = node.args[1]
            if not (qdq_op(dequantize) or "").startswith("dequantize"):
                raise RuntimeError(f"{node.name}: the weight is not dequantized from integers.")
            stored = _stored_tensor(program, dequantize.args[0])
            low, high = min(int(stored.min()), 0), max(int(stored.max()), 0)
            dtype = str(stored.dtype).removeprefix("torch.")
            precision = LayerPrecision(layer, kind, dtype, bits_used(low, high, stored.dtype.is_signed))
        if found.setdefault((kind, layer), precision) != precision:
            raise RuntimeError(f"{kind} {layer} is quantized twice: {found[kind, layer]} and {precision}")
    return list(found.values())


def payload_bytes(program: torch.export.ExportedProgram) -> int:
    """Bytes of the stored tensors (weights, scales, zero points, biases), without the file format."""
    tensors = [*program.state_dict.values(), *program.constants.values()]
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def check_quantized(program: torch.export.ExportedProgram) -> Counter[str]:
    """Fail unless the saved program really quantizes: q/dq ops on activations and on every weight."""
    counts = qdq_counts(program.graph_module)
    aten = torch.ops.aten
    n_weights = count_targets(program.graph_module, aten.conv2d.default, aten.linear.default)
    n_weight_dq = len(weight_dequantizes(program))
    if counts["quantize_per_tensor"] == 0 or counts["dequantize_per_tensor"] == 0 or n_weight_dq < n_weights:
        raise RuntimeError(
            f"The converted model is not quantized: {dict(counts)}; {n_weight_dq}/{n_weights} weights "
            f"dequantized from integers."
        )
    return counts


def count_targets(gm: fx.GraphModule, *targets: Any) -> int:
    return sum(node.op == "call_function" and node.target in targets for node in gm.graph.nodes)


def is_zero_pad(node: fx.Node) -> bool:
    if node.op != "call_function" or node.target != torch.ops.aten.pad.default:
        return False
    mode = node.args[2] if len(node.args) > 2 else node.kwargs.get("mode", "constant")
    value = node.args[3] if len(node.args) > 3 else node.kwargs.get("value", 0.0)
    return mode == "constant" and not value


def fold_weight_dequantize(gm: fx.GraphModule) -> int:
    """Replace each dequantize of a stored integer weight by its result, computed once by the same op on the
    same stored tensors: the numbers the program computes on every call (the same predictions, bit for bit),
    without dequantizing the weights again per call. Returns how many were folded."""
    folded = 0
    for node in list(gm.graph.nodes):
        if not (qdq_op(node) or "").startswith("dequantize"):
            continue
        if not node.all_input_nodes or any(arg.op != "get_attr" for arg in node.all_input_nodes):
            continue  # an activation's dequantize (its input is computed)
        args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda arg: get_attr(gm, arg.target))
        name = f"folded_weight_{folded}"
        gm.register_buffer(name, node.target(*args, **kwargs))
        with gm.graph.inserting_before(node):
            node.replace_all_uses_with(gm.graph.get_attr(name))
        gm.graph.erase_node(node)
        folded += 1
    gm.graph.eliminate_dead_code()
    drop_unused_attributes(gm)
    gm.recompile()
    return folded
