"""Bad input through the CLI, as a user would meet it: each fails with a specific one-line error (no
traceback), a non-zero exit, nothing half-written, the failure recorded in MLflow and no run left RUNNING.
Also two sweeps writing to one SQLite store at the same time."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from resnet8ptq.data import BINARY_DIR, MD5_CACHE
from resnet8ptq.model import MODEL_FILENAME, MODEL_SHA256
from tests.integration.servers import free_port


def runs_in(workdir: Path) -> list[Run]:
    if not (workdir / "mlflow.db").exists():
        return []
    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("resnet8ptq")
    return client.search_runs([experiment.experiment_id]) if experiment else []


def failed_cleanly(result: subprocess.CompletedProcess, workdir: Path, message: str) -> list[Run]:
    """Non-zero exit, the message on stderr without a traceback, no run left RUNNING; returns the runs."""
    assert result.returncode != 0
    assert message in result.stderr, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    runs = runs_in(workdir)
    assert not [r for r in runs if r.info.status == "RUNNING"]
    return runs


def assert_recorded(runs: list[Run], message: str) -> None:
    """The quantized run and the sweep run are FAILED, both with the error."""
    (parent,) = (r for r in runs if r.data.tags.get("sweep") == "true")
    (child,) = (r for r in runs if r.data.tags.get("quantized") == "true")
    for run in (parent, child):
        assert run.info.status == "FAILED"
        assert message in run.data.tags["error"]


@pytest.fixture
def workdir(tmp_path: Path, initialised_store: Path) -> Path:
    """A working directory holding an (empty) MLflow store, as after earlier use."""
    shutil.copy(initialised_store, tmp_path / "mlflow.db")
    return tmp_path


def listing(directory: Path) -> dict[str, int]:
    """Every file under directory (symlinks not followed) with its size."""
    return {str(p.relative_to(directory)): p.lstat().st_size for p in sorted(directory.rglob("*"))}


# --- fails before any work: nothing started ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("backend=tensorrt", "Could not find 'backend/tensorrt'"),
        ("per_channel=maybe", "Value 'maybe' is not a valid bool"),
        ("mcu/boards=[pico,esp32]", "Could not load 'mcu/boards/esp32'"),  # no such board
    ],
)
def test_bad_setting_fails_before_anything_starts(
    run_cli, tmp_path: Path, override: str, message: str
) -> None:
    result = run_cli(tmp_path, override)
    failed_cleanly(result, tmp_path, message)
    assert list(tmp_path.iterdir()) == []  # no store, no run directory


def test_registering_without_logged_models_fails_before_anything_starts(run_cli, tmp_path: Path) -> None:
    result = run_cli(tmp_path, "-m", "mlflow.register_as=resnet8-best", "mlflow.log_models=false")
    message = "ConfigError: mlflow.register_as=resnet8-best with mlflow.log_models=false"
    failed_cleanly(result, tmp_path, message)
    assert list(tmp_path.iterdir()) == []


def test_unreachable_tracking_server_fails_fast(run_cli, tmp_path: Path) -> None:
    uri = f"http://127.0.0.1:{free_port()}"
    start = time.monotonic()
    result = run_cli(tmp_path, "-m", f"mlflow.tracking_uri={uri}", timeout=60)
    assert time.monotonic() - start < 30
    failed_cleanly(result, tmp_path, f"TrackingError: MLflow tracking server {uri} is unreachable")
    assert list(tmp_path.iterdir()) == []


# --- fails in the run: recorded in MLflow ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ("calib=entropy", "calib.num_quantized_bins=2048"),
            "ConfigError: calib.num_quantized_bins=2048 must be >= 2 and smaller than calib.num_bins=2048",
        ),
        (("device=cim", "device.rows=0"), "ConfigError: device.rows=0: expected >= 1 rows, or null."),
        (("device.adc_bits=6",), "ConfigError: device.adc_bits=6 with device=none: crossbar settings need"),
        (
            ("device=cim", "device.bits_per_cell=2", "device.cells_per_weight=3"),
            "ConfigError: device.bits_per_cell=2 x device.cells_per_weight=3 hold 6 magnitude bits",
        ),
        (
            ("device=cim", "device.adc_bits=4", "device.adc_range=percentile", "device.adc_percentile=150"),
            "ConfigError: device.adc_percentile=150.0: expected a percentile in (0, 100].",
        ),
        (
            ("device=cim", "device.adc_bits=3", "components.required=true"),
            "ConfigError: components.required=true: device.adc_bits=3 is outside hwcomponents-adc's range "
            "(4..20 bits",
        ),
    ],
    ids=[
        "calibration",
        "device-rows",
        "device-option-without-device",
        "device-cells",
        "adc-percentile",
        "chip-cost-adc-range",
    ],
)
def test_bad_value_fails_before_the_run(
    run_cli, workdir: Path, overrides: tuple[str, ...], message: str
) -> None:
    """A value of the right type that is not allowed: no quantized run; the sweep run holds the error."""
    result = run_cli(workdir, *overrides)
    (parent,) = failed_cleanly(result, workdir, message)
    assert parent.info.status == "FAILED" and parent.data.tags["error"].startswith(message)


def test_a_board_without_its_ram_fails_before_the_run(run_cli, workdir: Path, tmp_path_factory) -> None:
    """A board a user adds in their own config directory (hydra.searchpath), without its RAM figure."""
    user_conf = tmp_path_factory.mktemp("user-conf")
    (user_conf / "mcu" / "boards").mkdir(parents=True)
    (user_conf / "mcu" / "boards" / "mine.yaml").write_text(
        "mine:\n  core: Cortex-M33\n  clock_mhz: 100\n  flash_kib: 512\n"
    )
    result = run_cli(
        workdir, "backend=tflite", f"hydra.searchpath=[file://{user_conf}]", "mcu/boards=[pico,mine]"
    )
    message = "ConfigError: mcu.boards.mine has no ram_kib: a board needs its core, clock_mhz, ram_kib"
    (parent,) = failed_cleanly(result, workdir, message)
    assert parent.info.status == "FAILED" and parent.data.tags["error"].startswith(message)


def test_unexpected_error_keeps_its_traceback(run_cli, workdir: Path) -> None:
    """Not one of the known errors (a cache_dir under a file): Hydra's traceback stays, the run is FAILED."""
    (workdir / "file").write_text("a file, not a directory\n")
    result = run_cli(workdir, f"cache_dir={workdir / 'file' / 'cache'}")
    assert result.returncode != 0
    assert "Traceback" in result.stderr and "NotADirectoryError" in result.stderr
    runs = runs_in(workdir)
    assert {r.info.status for r in runs} == {"FAILED"}
    (child,) = (r for r in runs if r.data.tags.get("quantized") == "true")
    assert child.data.tags["error"].startswith("NotADirectoryError")


def damaged_cifar(assets_dir: Path, root: Path, damage: Callable[[bytes], bytes]) -> Path:
    """root/cifar-10-batches-bin/: symlinks to the real files, test_batch.bin a damaged copy."""
    batches = root / BINARY_DIR
    batches.mkdir(parents=True)
    for source in (assets_dir / BINARY_DIR).iterdir():
        if source.name == "test_batch.bin":
            (batches / source.name).write_bytes(damage(source.read_bytes()))
        else:
            (batches / source.name).symlink_to(source)
    return root


def flip_byte(content: bytes, at: int = 1000) -> bytes:
    return content[:at] + bytes([content[at] ^ 0xFF]) + content[at + 1 :]


def bad_data_root(tmp_path: Path, assets_dir: Path, case: str) -> tuple[list[str], str]:
    if case == "missing":
        root = tmp_path / "nowhere"
        return [f"data.root={root}", "data.download=false"], f"CIFAR-10 not found under {root}"
    damage = {"truncated": lambda b: b[: len(b) // 2], "corrupted": flip_byte}[case]
    root = damaged_cifar(assets_dir, tmp_path / "cifar", damage)
    message = {
        "truncated": "test_batch.bin: size 15,365,000 bytes, expected 30,730,000 (truncated?)",
        "corrupted": "test_batch.bin: md5 ",
    }[case]
    return [f"data.root={root}"], message


@pytest.mark.parametrize("case", ["missing", "truncated", "corrupted"])
def test_bad_data(run_cli, workdir: Path, assets_dir: Path, case: str) -> None:
    overrides, message = bad_data_root(workdir, assets_dir, case)
    before = listing(workdir / "cifar") if case != "missing" else {}
    runs = failed_cleanly(run_cli(workdir, *overrides), workdir, message)
    assert_recorded(runs, message)
    if case == "missing":
        assert not (workdir / "nowhere").exists()  # not created (download=false)
    else:
        assert listing(workdir / "cifar") == before  # left as it was: nothing downloaded or extracted


def bad_network(tmp_path: Path, case: str) -> tuple[list[str], str]:
    """A network with a toolchain or data it cannot take: the overrides and the error's words."""
    kws = ["model=kws", "data=npz", f"data.path={tmp_path / 'kws.npz'}"]
    inputs = {"kws shape": (49, 10, 1), "vww shape": (96, 96, 3), "no labels": (49, 10, 1)}.get(case)
    if inputs is not None:
        arrays = {"calibration_inputs": np.zeros((4, *inputs), np.float32)}
        arrays["test_inputs"] = np.zeros((6, *inputs), np.float32)
        if case != "no labels":
            arrays["test_labels"] = np.arange(6)
        np.savez(tmp_path / "kws.npz", **arrays)
    return {
        "kws on cifar10": (["model=kws"], "the model takes inputs of shape (N, 49, 10, 1); data=cifar10"),
        "no labels": (kws, "kws.npz lacks test_labels"),
        "vww shape": (kws, "the model takes inputs of shape (N, 49, 10, 1); data=npz"),
    }[case]


@pytest.mark.parametrize("case", ["kws on cifar10", "no labels", "vww shape"])
def test_data_the_network_cannot_take(run_cli, workdir: Path, case: str) -> None:
    """A network's data that is missing, malformed or of another network's shape: the run fails with what
    is wrong, recorded, nothing cached but the converted model."""
    overrides, message = bad_network(workdir, case)
    runs = failed_cleanly(run_cli(workdir, *overrides), workdir, message)
    assert_recorded(runs, message)


def test_an_operator_the_device_cannot_compute_is_refused_before_any_quantization(
    run_cli, workdir: Path
) -> None:
    """A user's network with a Rescaling layer (a Mul of the input), on the integer device: refused naming the
    node once the FP32 model is read, before it is quantized; the run FAILED with the reason."""
    from tests.integration.test_networks import user_onnx

    model = user_onnx(workdir / "user_net.onnx", rescale=True)
    overrides = ["model=custom", f"model.path={model}", "device=integer"]
    message = "device=integer cannot run model=custom: Mul (rescaling)"
    runs = failed_cleanly(run_cli(workdir, *overrides), workdir, message)
    assert_recorded(runs, message)
    assert not list(workdir.rglob("model_quantized*"))


def test_a_toolchain_that_cannot_take_the_network_fails_before_the_run(run_cli, tmp_path: Path) -> None:
    """TFLite's converter reads Keras models; KWS comes as a float .tflite: refused before any work."""
    result = run_cli(tmp_path, "model=kws", "backend=tflite", "data=npz", f"data.path={tmp_path / 'x.npz'}")
    failed_cleanly(result, tmp_path, "backend=tflite converts Keras models (.h5, .keras)")
    assert not any(tmp_path.rglob("*.onnx"))


@pytest.mark.parametrize("per_class", [0, -1, 5001])
def test_calibration_sample_size_out_of_range(run_cli, workdir: Path, per_class: int) -> None:
    message = f"per_class={per_class} (data.calib_per_class) is out of range: allowed 1..5000"
    runs = failed_cleanly(run_cli(workdir, f"data.calib_per_class={per_class}"), workdir, message)
    assert_recorded(runs, message)


def bad_model(tmp_path: Path, assets_dir: Path, case: str) -> tuple[list[str], str]:
    h5 = tmp_path / MODEL_FILENAME
    if case == "missing":
        return [f"model.path={h5}"], f"model.path={h5} does not exist"
    if case == "wrong sha256":
        h5.write_bytes(flip_byte((assets_dir / "models" / MODEL_FILENAME).read_bytes(), at=50_000))
        return [f"model.path={h5}"], f"does not match the expected {MODEL_SHA256}"
    if case == "other input":  # MLPerf Tiny's anomaly detection autoencoder: 640-value vectors
        shutil.copy(assets_dir / "models" / "mlperf_tiny" / "anomaly_detection" / "ad01.h5", h5)
        message = f"model=custom ({h5}): the model takes inputs of shape (N, 640); data=cifar10"
        return ["model=custom", f"model.path={h5}"], message
    h5.write_text("not a model\n")
    return [f"model.path={h5}", "model.sha256=null"], f"{h5} is not an HDF5 file"


@pytest.mark.parametrize("case", ["missing", "wrong sha256", "not HDF5", "other input"])
def test_bad_model(run_cli, workdir: Path, assets_dir: Path, case: str) -> None:
    overrides, message = bad_model(workdir, assets_dir, case)
    cache = workdir / "cache"
    runs = failed_cleanly(run_cli(workdir, *overrides, f"cache_dir={cache}"), workdir, message)
    assert_recorded(runs, message)
    cached = sorted(p.name for p in cache.rglob("*") if p.suffix != ".onnx" and p.name != "onnx")
    # Nothing cached but the (good) CIFAR-10 files' checksums, read before the model, and for a model of
    # other inputs its (complete) conversion, which showed what it takes.
    assert cached in ([], [MD5_CACHE])
    assert not list(cache.rglob("*.onnx")) or case == "other input"


# --- the output directory ----------------------------------------------------------------------------------


@contextlib.contextmanager
def tmpfs(path: Path, options: str) -> Iterator[Path]:
    """A tmpfs mounted at path (root only; the test is skipped where mounting is not allowed)."""
    path.mkdir()
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mount.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.mark.parametrize("kind", ["read-only mount", "path under a regular file"])
def test_unwritable_output_directory(run_cli, workdir: Path, kind: str) -> None:
    """As root, chmod 0555 does not stop writes: a read-only tmpfs does, and so does a path under a file."""
    with contextlib.ExitStack() as stack:
        if kind == "read-only mount":
            parent, reason = (
                stack.enter_context(tmpfs(workdir / "ro", "ro,size=64k")),
                "Read-only file system",
            )
        else:
            parent, reason = workdir / "file", "Not a directory"
            parent.write_text("a file, not a directory\n")
        result = run_cli(workdir, f"hydra.run.dir={parent / 'run'}")
        runs = failed_cleanly(result, workdir, f"Cannot write the output directory {parent / 'run'}")
        assert reason in result.stderr
        assert runs == []  # stopped before any run was started


def test_full_output_directory(run_cli, workdir: Path, model_cache: Path) -> None:
    """The run fails where it writes (after the FP32 evaluation); the model cache is left as it was, but for
    the FP32 evaluation, kept whole (resnet8ptq/evaluation_cache.py): no scratch or partial entry."""
    cache_before = listing(model_cache)
    with tmpfs(workdir / "full", "size=100k") as full:
        result = run_cli(workdir, f"hydra.run.dir={full / 'run'}", "report.enabled=false")
    message = "No space left on device"
    runs = failed_cleanly(result, workdir, message)
    assert_recorded(runs, message)
    assert f"output directory {full / 'run'}" in result.stderr  # the message says where
    after = listing(model_cache)
    assert {path: size for path, size in after.items() if path in cache_before} == cache_before
    added = {Path(path) for path in after.keys() - cache_before.keys()} - {Path(MD5_CACHE)}  # run alone
    assert all(path.parts[0] == "eval" and ".tmp" not in path.name for path in added), added
    for entry in (path for path in added if len(path.parts) == 2 and not path.suffix):
        assert {entry / "record.json", entry / "probabilities_0.npy"} <= added


# --- download failure (the archive URL is a module constant: tested at the function level) ----------------


# --- two sweeps, one store ---------------------------------------------------------------------------------


def test_two_sweeps_on_one_store_at_once(run_cli, tmp_path: Path) -> None:
    """Both start on a fresh SQLite store (MLflow creates its tables without a lock) and write together."""

    def sweep(dtype: str) -> subprocess.CompletedProcess:
        lean = ("report.enabled=false", "layer_analysis=false", "mlflow.log_models=false")
        return run_cli(tmp_path, "-m", "backend=onnx", f"dtype={dtype}", *lean)

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(sweep, ["int8", "uint8"]))
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
        assert "database is locked" not in result.stderr + result.stdout
    runs = runs_in(tmp_path)
    assert {r.info.status for r in runs} == {"FINISHED"}
    parents = [r for r in runs if r.data.tags.get("sweep") == "true"]
    assert len(parents) == 2
    for parent in parents:
        children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
        assert sorted(r.data.tags["quantized"] for r in children) == ["false", "true"]
