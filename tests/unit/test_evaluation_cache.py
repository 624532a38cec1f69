"""Evaluations on disk (resnet8ptq/evaluation_cache.py), with hand-made predictors over a hand-made model
file: a second evaluation of the same model content, forms and test set reads the first one's probabilities,
seconds and latency (tag `eval.reused`) without running a predictor, and the verdict is judged again with the
run's own tolerance; another model, form, test set, backend setting or machine is measured; a half-written or
damaged entry is measured again and replaced."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from resnet8ptq import hardware
from resnet8ptq.backends.base import Model, QuantizedModel, Runtime
from resnet8ptq.backends.onnx.backend import OnnxRuntimeBackend
from resnet8ptq.evaluate import Measured, TestSet, evaluate, evaluate_baseline
from resnet8ptq.evaluation_cache import CACHE_SUBDIR, RECORD_FILE, EvaluationCache
from resnet8ptq.execution import NATIVE, NATIVE_MISMATCH, evaluate_quantized
from resnet8ptq.records import read_back_tags
from resnet8ptq.spec import LayerPrecision
from tests.unit.test_onnx_float64 import conv_model

RNG = np.random.default_rng(0)
IMAGES = RNG.uniform(0, 255, size=(40, 32, 32, 3)).astype(np.float32)
WEIGHTS = RNG.normal(size=(32 * 32 * 3, 10)).astype(np.float32)
LABELS = (IMAGES.reshape(len(IMAGES), -1) @ WEIGHTS).argmax(axis=1)  # the unflipped predictor is always right
TEST = TestSet(IMAGES, LABELS)
LAYERS = [LayerPrecision("conv", "weight", "int8", 8), LayerPrecision("conv", "activation", "uint8", 8)]


class Counted:
    """A predictor that counts the images it was asked for; ``flip``: its last output class moves up one."""

    def __init__(self, flip: int = 0) -> None:
        self.images = 0
        self.flip = flip

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        self.images += len(batch)
        logits = batch.reshape(len(batch), -1) @ WEIGHTS
        if self.flip:
            top = logits[-self.flip :].argmax(axis=1)
            logits[np.arange(len(logits) - self.flip, len(logits)), (top + 1) % 10] = logits.max() + 1
        return logits


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return conv_model(tmp_path / "model.onnx", RNG.normal(size=(4, 2, 3, 3)).astype(np.float32))


def cache(tmp_path: Path, **settings: object) -> EvaluationCache:
    parts = {"test_set": "digest", "backend": "onnx", "threads": 1, **settings}
    return EvaluationCache(tmp_path / "cache" / CACHE_SUBDIR, parts)


def quantized(path: Path, reference: Counted, runtime: Counted) -> QuantizedModel:
    form = Runtime(runtime, integer_kernels=True, kernels="QLinearConv x1")
    return QuantizedModel(path, reference, form, LAYERS, [], calib_seconds=0.0, quantize_seconds=0.0)


def test_a_second_evaluation_reads_the_first_and_judges_it_again(model: Path, tmp_path: Path) -> None:
    first_model = quantized(model, Counted(), Counted(flip=2))  # the runtime parts on 2 of 40 images
    first = evaluate_quantized(first_model, TEST, "m", 10.0, cache(tmp_path).measured)
    assert not first.reused and first.verdict.execution == NATIVE
    assert first_model.reference.images > len(IMAGES) and first_model.runtime.predict.images > len(IMAGES)

    again = quantized(model, Counted(), Counted(flip=2))
    second = evaluate_quantized(again, TEST, "m", 0.0, cache(tmp_path).measured)  # a tolerance of 0 points
    assert again.reference.images == again.runtime.predict.images == 0  # nothing ran
    assert second.reused and read_back_tags(again, second)["eval.reused"] == "true"
    for stored, read in ((first.reference, second.reference), (first.runtime, second.runtime)):
        assert np.array_equal(read.probabilities, stored.probabilities)
        assert read.probabilities.dtype == stored.probabilities.dtype
        assert np.array_equal(read.predictions, stored.predictions)
        assert read.accuracy == stored.accuracy and read.eval_seconds == stored.eval_seconds
    assert second.latency_ms_b1 == first.latency_ms_b1
    assert first.verdict.gap_points == second.verdict.gap_points == -5.0  # 2 of 40 images
    assert second.verdict.execution == NATIVE_MISMATCH  # judged with this run's tolerance
    assert read_back_tags(first_model, first)["eval.reused"] == "false"
    uncached = evaluate_quantized(quantized(model, Counted(), Counted(flip=2)), TEST, "m", 10.0)
    assert not uncached.reused and np.array_equal(uncached.runtime.predictions, first.runtime.predictions)


def test_one_program_is_stored_once_and_read_as_one(model: Path, tmp_path: Path) -> None:
    predictor = Counted()
    one = QuantizedModel(model, predictor, Runtime(predictor, False, "float"), LAYERS, [], 0.0, 0.0)
    first = evaluate_quantized(one, TEST, "m", 0.3, cache(tmp_path).measured)
    second = evaluate_quantized(one, TEST, "m", 0.3, cache(tmp_path).measured)
    assert first.runtime is first.reference and second.runtime is second.reference and second.reused
    (entry,) = (tmp_path / "cache" / CACHE_SUBDIR).glob("*/")
    assert sorted(path.name for path in entry.iterdir()) == ["probabilities_0.npy", RECORD_FILE]


def test_a_baseline_is_kept_like_a_quantized_model(model: Path, tmp_path: Path) -> None:
    predictor = Counted()
    first = evaluate_baseline(Model(predictor, model, model), TEST, "fp32", cache(tmp_path).measured)
    ran = predictor.images
    second = evaluate_baseline(Model(predictor, model, model), TEST, "fp32", cache(tmp_path).measured)
    assert predictor.images == ran and not first.reused and second.reused
    assert np.array_equal(second.evaluation.probabilities, first.evaluation.probabilities)
    assert second.latency_ms_b1 == first.latency_ms_b1


def test_the_key_is_what_an_evaluation_depends_on(model: Path, tmp_path: Path) -> None:
    forms = {"fp32": True}
    before = cache(tmp_path).key(model, forms, TEST)
    other_model = conv_model(tmp_path / "other.onnx", RNG.normal(size=(4, 2, 3, 3)).astype(np.float32))
    assert cache(tmp_path).key(model, forms, TestSet(IMAGES.copy(), LABELS.copy())) == before
    for changed in (
        cache(tmp_path).key(other_model, forms, TEST),
        cache(tmp_path).key(model, {"fp32": False}, TEST),
        cache(tmp_path).key(model, forms, TestSet(IMAGES[:-1], LABELS[:-1])),
        cache(tmp_path, test_set="another test set's digest").key(model, forms, TEST),
        cache(tmp_path, threads=2).key(model, forms, TEST),
    ):
        assert changed != before
    made = EvaluationCache.of(OnnxRuntimeBackend(native=False, threads=1), tmp_path, "digest")
    assert made.root == tmp_path / CACHE_SUBDIR and made.settings["test_set"] == "digest"
    assert made.settings["machine"] == hardware.detect().tags()  # CPU, ISA, cores, kernel path
    assert {"backend", "native", "threads", "versions"} <= set(made.settings)


@pytest.mark.parametrize(
    "damage",
    ["no probabilities", "truncated probabilities", "other images' probabilities", "bad record"],
)
def test_a_half_written_or_damaged_entry_is_measured_again(model: Path, tmp_path: Path, damage: str) -> None:
    def measure() -> Measured:
        return Measured((evaluate(Counted(), TEST),), 1.5)

    store = cache(tmp_path)
    entry = store.root / store.key(model, {}, TEST)
    entry.mkdir(parents=True)
    (entry / RECORD_FILE).write_text('{"eval_seconds": [1.0], "latency_ms_b1": 2.0}')
    probabilities = entry / "probabilities_0.npy"
    if damage == "truncated probabilities":
        np.save(probabilities, np.ones((len(IMAGES), 10), np.float32))
        probabilities.write_bytes(probabilities.read_bytes()[:-100])
    elif damage == "other images' probabilities":
        np.save(probabilities, np.ones((len(IMAGES) - 1, 10), np.float32))
    elif damage == "bad record":
        np.save(probabilities, np.ones((len(IMAGES), 10), np.float32))
        (entry / RECORD_FILE).write_text('{"eval_seconds": [1.0]')
    found = store.measured(model, {}, TEST, measure)
    assert not found.reused and found.latency_ms_b1 == 1.5
    again = store.measured(model, {}, TEST, measure)  # the entry was replaced
    assert again.reused and np.array_equal(
        again.evaluations[0].probabilities, found.evaluations[0].probabilities
    )
