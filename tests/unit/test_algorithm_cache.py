"""The algorithms' output reused across runs (`algo.reuse`, resnet8ptq/algorithms/_cache.py): computed once
for the same inputs, taken back with its seconds, tags and learned ranges; a new key for any input that
changes the output; never a half-written entry."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

import resnet8ptq.algorithms as algorithms
from resnet8ptq.algorithms import AlgoConfig, Context, Prepared, _cache, learning_settings, prepare
from resnet8ptq.calibration import CalibConfig
from resnet8ptq.device.adc import Geometry, LayerSteps
from resnet8ptq.device.config import Crossbar
from resnet8ptq.dtype import DtypeConfig
from resnet8ptq.spec import QuantSpec

SPEC = QuantSpec(DtypeConfig("int8", "int8"), CalibConfig("minmax"))
IMAGES = np.zeros((2, 1, 2, 2), np.float32)
CONTEXT = Context(IMAGES, SPEC)  # prepare() gives the steps a context of their own


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    """A one-conv ONNX model."""
    conv = onnx.helper.make_node("Conv", ["x", "w"], ["y"], name="conv")
    graph = onnx.helper.make_graph(
        [conv],
        "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 1, 2, 2])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 1, 2, 2])],
        [onnx.numpy_helper.from_array(np.ones((1, 1, 1, 1), np.float32), "w")],
    )
    path = tmp_path / "tiny.onnx"
    onnx.save(onnx.helper.make_model(graph), path)
    return path


LEARNED_ADC = LayerSteps(
    Geometry(2, 1, 3), "tile", np.array([4.0, 0.5078125]), np.array([-8, -3]), np.array([7, 12]), "ab12"
)
"""Device-aware learning's ADC steps as the cache keeps them (a power of two, a fixed-point step)."""


@pytest.fixture
def applied(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Counts the times the steps really run (each call's workdir), and gives them a learned range."""
    calls: list[Path] = []
    real = algorithms._apply

    def counting(algo, onnx_path, context, workdir) -> Prepared:
        calls.append(workdir)
        done = real(algo, onnx_path, context, workdir)
        return Prepared(done.onnx_path, 1.25, done.tags, {"y": (-0.5, 1.0 / 3)}, {"conv": LEARNED_ADC})

    monkeypatch.setattr(algorithms, "_apply", counting)
    return calls


def test_the_second_run_takes_the_first_ones_output(tiny: Path, tmp_path: Path, applied: list) -> None:
    cache = tmp_path / "cache"
    first = prepare(AlgoConfig(["cle"]), tiny, Context(IMAGES, SPEC, seed=3), tmp_path / "a", cache_dir=cache)
    second = prepare(
        AlgoConfig(["cle"]), tiny, Context(IMAGES, SPEC, seed=3), tmp_path / "b", cache_dir=cache
    )
    assert len(applied) == 1
    assert first.tags == {"algo.cle_pairs": "none found", "algo.reused": "false"}
    assert second.tags == {"algo.cle_pairs": "none found", "algo.reused": "true"}
    assert second.seconds == first.seconds == 1.25  # what the steps took when they ran
    assert second.ranges == first.ranges == {"y": (-0.5, 1.0 / 3)}  # floats exactly
    (steps,) = second.adc_steps.values()  # learned ADC steps, exactly
    assert steps.to_record() == LEARNED_ADC.to_record() and steps.steps.dtype == np.float64
    assert second.onnx_path == tmp_path / "b" / "model_fp32_algo.onnx"  # in its own run's directory
    assert second.onnx_path.read_bytes() == first.onnx_path.read_bytes()


def test_reuse_false_runs_the_steps_again(tiny: Path, tmp_path: Path, applied: list) -> None:
    cache = tmp_path / "cache"
    prepare(AlgoConfig(["cle"]), tiny, CONTEXT, tmp_path / "a", cache_dir=cache)
    again = prepare(AlgoConfig(["cle"], reuse=False), tiny, CONTEXT, tmp_path / "b", cache_dir=cache)
    assert len(applied) == 2 and again.tags["algo.reused"] == "false"


def test_without_a_cache_nothing_is_stored_or_tagged(tiny: Path, tmp_path: Path, applied: list) -> None:
    for workdir in ("a", "b"):
        done = prepare(AlgoConfig(["cle"]), tiny, CONTEXT, tmp_path / workdir)
        assert "algo.reused" not in done.tags
    assert len(applied) == 2
    assert prepare(AlgoConfig([]), tiny, CONTEXT, tmp_path / "c", cache_dir=tmp_path).tags == {}


def test_every_input_of_the_output_is_in_the_key(tiny: Path, tmp_path: Path) -> None:
    def key(**changed) -> str:
        inputs = {"onnx_path": tiny, "images": IMAGES, "spec": SPEC, "steps": {"cle": None}, "seed": 0}
        return _cache.key(**(inputs | changed))

    adaround = AlgoConfig(["adaround"]).parameters("adaround")
    other = tmp_path / "other.onnx"
    other.write_bytes(tiny.read_bytes() + b"\0")
    variants = [
        key(onnx_path=other),
        key(images=IMAGES + 1),
        key(spec=QuantSpec(DtypeConfig("int8", "int8", weight_bits=4), CalibConfig("minmax"))),
        key(spec=QuantSpec(DtypeConfig("int8", "int8"), CalibConfig("minmax"), per_channel=True)),
        key(steps={"cle": None, "adaround": adaround}),
        key(steps={"adaround": AlgoConfig(["adaround"], adaround_iterations=7).parameters("adaround")}),
        key(steps={"adaround": adaround}),
        key(seed=1),
        key(device=learning_settings(Crossbar(rows=128, adc_bits=4), False)),  # learned against a crossbar
        key(device=learning_settings(Crossbar(rows=128, adc_bits=5), False)),
        key(device=learning_settings(Crossbar(rows=128, adc_bits=4, weight_noise=0.01), True)),  # noisy chips
        key(device=learning_settings(Crossbar(rows=128, adc_bits=4, weight_noise=0.02), True)),
    ]
    assert len({key(), *variants}) == len(variants) + 1
    # what the learning does not see (the evaluation's ADC rule; noise, unless it learns on noisy chips; a
    # read's effects in any case) is not in the key
    seen = learning_settings(Crossbar(rows=128, adc_bits=4), False)
    assert seen == learning_settings(Crossbar(rows=128, adc_bits=4, adc_range="max", weight_noise=0.1), False)
    noisy = learning_settings(Crossbar(rows=128, adc_bits=4, weight_noise=0.1), True)
    assert noisy == learning_settings(Crossbar(rows=128, adc_bits=4, weight_noise=0.1, read_noise=0.1), True)
    assert key() == key()  # and nothing else: a copy of the model elsewhere is the same model
    copy = tmp_path / "copy.onnx"
    copy.write_bytes(tiny.read_bytes())
    assert key(onnx_path=copy) == key()


def test_the_code_the_cpu_and_its_kernel_path_are_in_the_key(
    tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from resnet8ptq import disk_cache, hardware

    for name in hardware.KERNEL_PATH_ENV:
        monkeypatch.delenv(name, raising=False)
    before = _cache.key(tiny, IMAGES, SPEC, {"cle": None}, 0)
    fingerprint, detect = disk_cache.source_fingerprint, hardware.detect
    monkeypatch.setattr(disk_cache, "source_fingerprint", lambda: "changed code")
    assert _cache.key(tiny, IMAGES, SPEC, {"cle": None}, 0) != before
    monkeypatch.setattr(disk_cache, "source_fingerprint", fingerprint)
    other_cpu = hardware.Hardware("Other CPU", ("avx2",), 2)
    monkeypatch.setattr(hardware, "detect", lambda: other_cpu)
    assert _cache.key(tiny, IMAGES, SPEC, {"cle": None}, 0) != before
    monkeypatch.setattr(hardware, "detect", detect)
    assert _cache.key(tiny, IMAGES, SPEC, {"cle": None}, 0) == before
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")  # the same CPU, oneDNN's kernels forced down
    assert _cache.key(tiny, IMAGES, SPEC, {"cle": None}, 0) != before


def test_a_half_written_entry_is_not_read(tiny: Path, tmp_path: Path, applied: list) -> None:
    """A scratch directory left by a killed run, or an entry without its record, is computed again, and the
    entry is replaced: the next run reuses it."""
    cache = tmp_path / "cache"
    entry_key = _cache.key(tiny, IMAGES, SPEC, {"cle": None}, 0)
    (cache / "algo" / f"{entry_key}.123.tmp").mkdir(parents=True)
    (cache / "algo" / entry_key).mkdir()
    (cache / "algo" / entry_key / "model_fp32_algo.onnx").write_bytes(b"truncated")
    done = prepare(AlgoConfig(["cle"]), tiny, CONTEXT, tmp_path / "a", cache_dir=cache)
    assert len(applied) == 1 and done.tags["algo.reused"] == "false"
    assert onnx.load(done.onnx_path).graph.node  # the model computed now, not the truncated file
    again = prepare(AlgoConfig(["cle"]), tiny, CONTEXT, tmp_path / "b", cache_dir=cache)
    assert len(applied) == 1 and again.tags["algo.reused"] == "true"


def test_an_unwritable_cache_only_costs_a_rerun(tiny: Path, tmp_path: Path, applied: list) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    done = prepare(AlgoConfig(["cle"]), tiny, CONTEXT, tmp_path / "a", cache_dir=blocked)
    assert done.tags["algo.reused"] == "false" and done.onnx_path.exists()


def test_the_record_is_readable_json(tiny: Path, tmp_path: Path, applied: list) -> None:
    cache = tmp_path / "cache"
    prepare(AlgoConfig(["cle"]), tiny, CONTEXT, tmp_path / "a", cache_dir=cache)
    (entry,) = (path for path in (cache / "algo").iterdir() if path.is_dir())
    record = json.loads((entry / "prepared.json").read_text())
    assert record == {
        "model": "model_fp32_algo.onnx",
        "seconds": 1.25,
        "tags": {"algo.cle_pairs": "none found"},
        "ranges": {"y": [-0.5, 1.0 / 3]},
        "adc_steps": {"conv": LEARNED_ADC.to_record()},
    }
    assert sorted(path.name for path in entry.iterdir()) == ["model_fp32_algo.onnx", "prepared.json"]


def test_parallel_jobs_with_the_same_inputs_compute_once(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two jobs at once (a parallel launcher's sweep over backends): the second waits for the first's
    output instead of computing it too."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    started, calls = threading.Event(), []
    real = algorithms._apply

    def slow(*inputs) -> Prepared:
        calls.append(inputs[3])  # the workdir
        started.set()
        time.sleep(0.5)
        return real(*inputs)

    monkeypatch.setattr(algorithms, "_apply", slow)

    def job(name: str) -> Prepared:
        if name == "b":
            started.wait(10)  # the first job is computing
        return prepare(AlgoConfig(["cle"]), tiny, CONTEXT, tmp_path / name, cache_dir=tmp_path / "cache")

    with ThreadPoolExecutor(2) as pool:
        first, second = pool.map(job, ["a", "b"])
    assert len(calls) == 1
    assert (first.tags["algo.reused"], second.tags["algo.reused"]) == ("false", "true")


def test_the_learning_sees_only_what_it_learns_from(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Device-aware learning gets the crossbar's partial sums and ADCs; on noisy chips its cells' effects
    too; never a read's effects or the evaluation's ADC rule; a learning that is not device-aware, nothing."""
    seen: list[Crossbar | None] = []
    monkeypatch.setattr(
        algorithms, "_apply", lambda *inputs: seen.append(inputs[2].crossbar) or Prepared(tiny)
    )
    chip = Crossbar(rows=128, adc_bits=4, adc_range="max", weight_noise=0.02, read_noise=0.01)
    for algo in (
        AlgoConfig(["brecq"], device_aware=True),
        AlgoConfig(["brecq"], device_aware=True, device_noise=True),
        AlgoConfig(["brecq"]),
    ):
        prepare(algo, tiny, Context(IMAGES, SPEC, crossbar=chip), tmp_path)
    assert seen == [Crossbar(rows=128, adc_bits=4), Crossbar(rows=128, adc_bits=4, weight_noise=0.02), None]
