"""Digests of what a run made (resnet8ptq.digests): equal for the same content whatever the metadata, the
order or the file's name; different for one changed value."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from resnet8ptq import digests
from resnet8ptq.digests import (
    integer_digest,
    model_digest,
    predictions_digest,
    ranges_digest,
    run_digests,
)
from resnet8ptq.spec import TensorRange
from tests.unit.test_device import conv_layer

ASSETS = Path(os.environ.get("RESNET8PTQ_ASSETS", Path(__file__).resolve().parents[3] / "shared"))


def test_ranges_digest_is_exact_and_ignores_order() -> None:
    ranges = [TensorRange("b", -1.5, 2.25), TensorRange("a", 0.0, 6.0)]
    assert ranges_digest(ranges) == ranges_digest(ranges[::-1])
    nudged = [ranges[0], TensorRange("a", 0.0, math.nextafter(6.0, 7.0))]  # one ulp
    assert ranges_digest(nudged) != ranges_digest(ranges)
    assert len(ranges_digest(ranges)) == 16


def test_predictions_digest_sees_one_image() -> None:
    predictions = np.arange(10_000) % 10
    changed = predictions.copy()
    changed[4321] = (changed[4321] + 1) % 10
    assert predictions_digest(predictions) == predictions_digest(predictions.astype(np.int64))
    assert predictions_digest(changed) != predictions_digest(predictions)


def tiny_onnx(weight: np.ndarray) -> onnx.ModelProto:
    node = helper.make_node("MatMul", ["x", "w"], ["y"], doc_string="made by a test")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
        [numpy_helper.from_array(weight, "w")],
    )
    return helper.make_model(graph, producer_name="a", producer_version="1")


def test_onnx_digest_ignores_producer_and_doc_strings(tmp_path: Path) -> None:
    weight = np.eye(2, dtype=np.float32)
    first, second, changed = tmp_path / "a.onnx", tmp_path / "b.onnx", tmp_path / "c.onnx"
    onnx.save(tiny_onnx(weight), first)
    other = tiny_onnx(weight)
    other.producer_name, other.producer_version, other.doc_string = "b", "2", "another tool"
    onnx.helper.set_model_props(other, {"made": "today"})
    onnx.save(other, second)
    onnx.save(tiny_onnx(weight * 2), changed)
    assert first.read_bytes() != second.read_bytes()
    assert model_digest(first) == model_digest(second)
    assert model_digest(changed) != model_digest(first)


def test_pt2_digest_ignores_the_archives_name_and_its_random_id(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    module = torch.nn.Linear(2, 2)
    program = torch.export.export(module, (torch.zeros(1, 2),))
    first, second = tmp_path / "first.pt2", tmp_path / "second.pt2"
    torch.export.save(program, first)
    torch.export.save(program, second)
    assert first.read_bytes() != second.read_bytes()  # the archive's folder name, its serialization id
    assert model_digest(first) == model_digest(second)
    with torch.no_grad():
        module.weight[0, 0] += 1
    torch.export.save(torch.export.export(module, (torch.zeros(1, 2),)), tmp_path / "changed.pt2")
    assert model_digest(tmp_path / "changed.pt2") != model_digest(first)


def test_tflite_digest_ignores_description_and_metadata(tmp_path: Path) -> None:
    import flatbuffers
    from ai_edge_litert import schema_py_generated as schema

    source = ASSETS / "models" / "pretrainedResnet_quant.tflite"
    model = schema.ModelT.InitFromPackedBuf(source.read_bytes(), 0)

    def saved(name: str) -> Path:
        builder = flatbuffers.Builder(0)
        builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
        path = tmp_path / name
        path.write_bytes(bytes(builder.Output()))
        return path

    plain = saved("plain.tflite")
    model.description = b"converted elsewhere"
    metadata = schema.MetadataT()
    metadata.name, metadata.buffer = b"CONVERSION_METADATA", len(model.buffers)
    extra = schema.BufferT()
    extra.data = np.frombuffer(b"another converter", dtype=np.uint8)
    model.buffers.append(extra)
    model.metadata = [*(model.metadata or []), metadata]
    described = saved("described.tflite")
    weights = next(b for b in model.buffers if b.data is not None and len(b.data) > 1000)
    weights.data = weights.data.copy()
    weights.data[0] ^= 1
    changed = saved("changed.tflite")
    assert model_digest(plain) == model_digest(described) == model_digest(source)
    assert model_digest(changed) != model_digest(plain)


def test_integer_digest_sees_one_weight_and_not_the_notes() -> None:
    from resnet8ptq.device.graph import IntegerModel

    layer = conv_layer(np.random.default_rng(3))
    model = IntegerModel("onnx-qdq", "x", layer.input_quant, "half_to_even", [layer])
    noted = IntegerModel("onnx-qdq", "x", layer.input_quant, "half_to_even", [layer], notes=["a note"])
    original = integer_digest(model)
    assert integer_digest(noted) == original
    layer.weight[0, 0, 0, 0] += 1
    assert integer_digest(model) != original
    layer.weight[0, 0, 0, 0] -= 1
    layer.multiplier[0] += 1
    assert integer_digest(model) != original


def test_integer_digest_sees_groups_but_not_the_one_group_every_earlier_layer_had() -> None:
    """A grouped convolution digests otherwise; one group is left out (LATER_FIELDS), so that the digests
    pinned before layers had groups hold."""
    import dataclasses
    import hashlib

    from resnet8ptq.device.graph import IntegerModel

    layer = conv_layer(np.random.default_rng(3))
    model = IntegerModel("onnx-qdq", "x", layer.input_quant, "half_to_even", [layer])
    grouped = IntegerModel(
        "onnx-qdq", "x", layer.input_quant, "half_to_even", [dataclasses.replace(layer, groups=2)]
    )
    assert integer_digest(grouped) != integer_digest(model)
    fields = {k: v for k, v in dataclasses.asdict(layer).items() if k != "groups"}
    without = hashlib.sha256()
    digests._feed(without, fields)
    without.update(b";")  # a dataclass is fed as its fields' mapping, then closed like any value
    within = hashlib.sha256()
    digests._feed(within, layer)
    assert within.hexdigest() == without.hexdigest()


def test_a_run_digest_names_what_it_digested(tmp_path: Path) -> None:
    onnx.save(tiny_onnx(np.eye(2, dtype=np.float32)), tmp_path / "m.onnx")
    tags = run_digests(tmp_path / "m.onnx", np.zeros(10, dtype=np.int64), [TensorRange("a", 0.0, 1.0)])
    assert set(tags) == {"digest.model", "digest.predictions", "digest.calibration_ranges"}
    assert "digest.calibration_ranges" not in run_digests(tmp_path / "m.onnx", np.zeros(10, dtype=np.int64))
    with pytest.raises(ValueError, match=r"no content digest for a \.h5 file"):
        model_digest(tmp_path / "m.h5")
