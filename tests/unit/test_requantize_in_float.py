"""The compiled simulated program computes each activation's quantize -> dequantize pair in float: the same
numbers as the pair, bit for bit, for every integer type and range the backends use."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchao")

import torchao.quantization.pt2e  # noqa: E402, F401  (registers the quantized_decomposed ops)
from torch import fx  # noqa: E402

from resnet8ptq.backends.torch.compiled import requantize_in_float  # noqa: E402

QDQ = torch.ops.quantized_decomposed


class _Requantize(torch.nn.Module):
    """x -> quantize -> dequantize, with the dequantize's own parameters (normally the quantize's)."""

    def __init__(self, quantize: tuple, dequantize: tuple | None = None) -> None:
        super().__init__()
        self.quantize, self.dequantize = quantize, dequantize or quantize

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = QDQ.quantize_per_tensor.default(x, *self.quantize)
        return QDQ.dequantize_per_tensor.default(q, *self.dequantize)


def _inputs(scale: float, zero_point: int, qmin: int, qmax: int) -> torch.Tensor:
    """Values on the grid, halfway between grid points (ties), near them, and far outside the range."""
    steps = torch.arange(qmin - zero_point - 3, qmax - zero_point + 4, dtype=torch.float32)
    near = torch.cat([steps, steps + 0.5, steps + 0.4999, steps - 0.5, steps + 0.5001]) * scale
    return torch.cat([near, torch.randn(10_000) * scale * (qmax - qmin), torch.tensor([0.0, -0.0])])


@pytest.mark.parametrize(
    "quantize",
    [
        (0.0359156, -128, -128, 127, torch.int8),
        (0.0471618, -26, -128, 127, torch.int8),
        (0.0613518, 0, 0, 255, torch.uint8),
        (0.25, 3, -7, 7, torch.int8),  # a 4-bit range in int8
        (1.0, -128, -128, 127, torch.int8),  # the input layer's
        (0.001, 32768, 0, 65535, torch.uint16),
    ],
    ids=["int8", "int8-zp", "uint8", "int8-4bit", "unit-scale", "uint16"],
)
def test_float_requantization_is_the_pair_bit_for_bit(quantize: tuple) -> None:
    module = _Requantize(quantize)
    graph_module = fx.symbolic_trace(module)
    assert requantize_in_float(graph_module.graph) == 1
    graph_module.recompile()
    targets = {node.target for node in graph_module.graph.nodes if node.op == "call_function"}
    assert not any(getattr(t, "namespace", None) == "quantized_decomposed" for t in targets)
    x = _inputs(*quantize[:4])
    torch.testing.assert_close(graph_module(x), module(x), rtol=0, atol=0)


def test_a_pair_that_is_not_one_requantization_is_left_alone() -> None:
    """A dequantize with other parameters than its quantize's is not the identity on the grid: kept."""
    graph_module = fx.symbolic_trace(
        _Requantize((0.05, 0, -128, 127, torch.int8), (0.1, 0, -128, 127, torch.int8))
    )
    assert requantize_in_float(graph_module.graph) == 0
    ops = [node.target for node in graph_module.graph.nodes if node.op == "call_function"]
    assert ops == [QDQ.quantize_per_tensor.default, QDQ.dequantize_per_tensor.default]
