"""Digests of what a run made, so that two runs of one configuration (two machines, two kernel paths, two
commits) show at a glance where they part: the calibration ranges as computed, the quantized model's content,
its integer form when one is read, and the predictions on the test set. Each is the first 16 hex digits of a
SHA-256 over a canonical form that leaves out what does not change the model's meaning:

* **ranges**: every activation tensor's name, min and max (exact: ``float.hex``), in tensor-name order;
* **model**, by format: ONNX, the protobuf with ``producer_name``, ``producer_version``, every ``doc_string``
  and ``metadata_props`` cleared, serialized deterministically; TFLite, the flatbuffer re-packed without its
  ``description``, ``metadata`` and the buffers only metadata points at (the converter's version and options;
  the tensors' buffer indices renumbered);
  PT2, the archive's entries in name order with the archive's folder name stripped and without
  ``.data/serialization_id`` (random per save), contents only (no ZIP timestamps);
* **integer form**: every layer's integer parameters (:class:`~resnet8ptq.device.graph.IntegerModel`: weights,
  biases, multipliers, shifts, zero points, scales), as :func:`integer_digest` walks them (a field added
  later, :data:`LATER_FIELDS`, only where it differs from what earlier models had);
* **predictions**: the 10,000 predicted labels as little-endian int16.
"""

from __future__ import annotations

import dataclasses
import hashlib
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from resnet8ptq.spec import TensorRange

if TYPE_CHECKING:
    from resnet8ptq.device.graph import IntegerModel

LENGTH = 16
"""Hex digits kept of each SHA-256."""
RANDOM_PT2_ENTRIES = (".data/serialization_id",)
"""Entries of a PT2 archive that change on every save of the same program."""


LATER_FIELDS = {"groups": 1}
"""Fields the integer form gained after its digests were pinned, with the value every earlier model has:
left out of the digest at that value, so that a model's digest does not move because the form grew (a
convolution of one group is what every layer was before grouped convolutions)."""


def _hex(digest: hashlib._Hash) -> str:
    return digest.hexdigest()[:LENGTH]


def ranges_digest(ranges: Iterable[TensorRange]) -> str:
    """The calibration ranges as computed: each tensor's name, min and max, exactly, in name order."""
    digest = hashlib.sha256()
    for r in sorted(ranges, key=lambda r: r.tensor):
        digest.update(f"{r.tensor}\0{float(r.min).hex()}\0{float(r.max).hex()}\n".encode())
    return _hex(digest)


def predictions_digest(predictions: np.ndarray) -> str:
    """The per-sample predictions in test-set order: predicted labels (as int16), or anomaly scores (as
    float32)."""
    array = np.asarray(predictions)
    return _hex(hashlib.sha256(array.astype("<i2" if array.dtype.kind in "iub" else "<f4").tobytes()))


def model_digest(path: Path) -> str:
    """The saved model's content without its non-semantic metadata (the module's docstring says what is
    left out per format)."""
    suffix = path.suffix.lower()
    if suffix == ".onnx":
        return _hex(hashlib.sha256(_onnx_content(path)))
    if suffix == ".tflite":
        return _hex(hashlib.sha256(_tflite_content(path)))
    if suffix == ".pt2":
        return _pt2_digest(path)
    raise ValueError(f"{path}: no content digest for a {suffix or 'suffix-less'} file (onnx, tflite, pt2).")


def _onnx_content(path: Path) -> bytes:
    import onnx

    model = onnx.load(str(path))
    model.producer_name, model.producer_version, model.doc_string = "", "", ""
    del model.metadata_props[:]
    model.graph.doc_string = ""
    for node in model.graph.node:
        node.doc_string = ""
    for value in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        value.doc_string = ""
    return model.SerializeToString(deterministic=True)


def _tflite_content(path: Path) -> bytes:
    import flatbuffers
    from ai_edge_litert import schema_py_generated as schema

    model = schema.ModelT.InitFromPackedBuf(path.read_bytes(), 0)
    model.description = None
    tensors = [tensor for graph in model.subgraphs or [] for tensor in graph.tensors or []]
    used = {tensor.buffer for tensor in tensors}
    only_metadata = {m.buffer for m in model.metadata or []} - used
    kept = [index for index in range(len(model.buffers or [])) if index not in only_metadata]
    renumbered = {old: new for new, old in enumerate(kept)}
    model.buffers = [model.buffers[index] for index in kept]
    for tensor in tensors:
        tensor.buffer = renumbered[tensor.buffer]
    model.metadata = None
    builder = flatbuffers.Builder(0)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def _pt2_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with zipfile.ZipFile(path) as archive:
        entries = {info.filename.split("/", 1)[-1]: info for info in archive.infolist() if not info.is_dir()}
        for name in sorted(entries):
            if name in RANDOM_PT2_ENTRIES:
                continue
            digest.update(f"{name}\0{entries[name].file_size}\0".encode())
            digest.update(archive.read(entries[name]))
    return _hex(digest)


def integer_digest(model: IntegerModel) -> str:
    """The integer form: its input's quantization and rounding, then every layer's integer parameters and
    quantization in execution order (arrays by dtype, shape and bytes; floats exactly); not the reader's
    notes."""
    digest = hashlib.sha256()
    form = {
        field.name: getattr(model, field.name) for field in dataclasses.fields(model) if field.name != "notes"
    }
    form["layers"] = [(type(layer).__name__, layer) for layer in model.layers]
    _feed(digest, form)
    return _hex(digest)


def _feed(digest: hashlib._Hash, value: Any) -> None:
    """``value`` into ``digest``, canonically: mappings in key order, sequences in order, arrays by type,
    shape and bytes, floats by ``float.hex``."""
    if isinstance(value, dict):
        for key in sorted(value):
            digest.update(f"{key}=".encode())
            _feed(digest, value[key])
    elif isinstance(value, np.ndarray):
        array = np.ascontiguousarray(value)
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(array.tobytes())
    elif isinstance(value, (list, tuple)):
        digest.update(b"[")
        for item in value:
            _feed(digest, item)
        digest.update(b"]")
    elif isinstance(value, float):
        digest.update(value.hex().encode())
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.asdict(value)
        _feed(digest, {k: v for k, v in fields.items() if not (k in LATER_FIELDS and v == LATER_FIELDS[k])})
    else:
        digest.update(repr(value).encode())
    digest.update(b";")


def run_digests(
    model_path: Path, predictions: np.ndarray, ranges: Iterable[TensorRange] | None = None
) -> dict[str, str]:
    """A run's digest tags: its model's content and its predictions, and the calibration ranges it
    computed (a quantized run of this tool)."""
    tags = {"digest.model": model_digest(model_path), "digest.predictions": predictions_digest(predictions)}
    if ranges is not None:
        tags["digest.calibration_ranges"] = ranges_digest(ranges)
    return tags


def device_digests(model: IntegerModel, predictions: np.ndarray) -> dict[str, str]:
    """A device run's digest tags: the integer form it read and the device's predictions (first draw)."""
    return {
        "digest.integer_model": integer_digest(model),
        "digest.device_predictions": predictions_digest(predictions),
    }
