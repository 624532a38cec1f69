"""The drawing process: it draws a run's charts to the files the run's own process would have drawn, reports
a chart's error to the run, and when it is gone (or was never started) the run draws its charts itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pytest

from resnet8ptq import drawing
from resnet8ptq.data import CLASS_NAMES
from resnet8ptq.plots import confusion_matrix_png

MATRIX = np.arange(100).reshape(10, 10)


@pytest.fixture(autouse=True)
def _own_process():
    drawing.stop()
    yield
    drawing.stop()


def _worker_pid() -> int:
    drawing.start()
    drawing.wait_started()
    return drawing.draw(os.getpid).path()  # os.getpid, run in the worker: its pid


def test_a_chart_is_drawn_in_the_worker_as_the_run_would_draw_it(tmp_path: Path) -> None:
    assert _worker_pid() != os.getpid()
    here = confusion_matrix_png(MATRIX, CLASS_NAMES, tmp_path / "here.png", "t")
    there = drawing.draw(confusion_matrix_png, MATRIX, CLASS_NAMES, tmp_path / "there.png", "t").path()
    assert there == tmp_path / "there.png"
    assert there.read_bytes() == here.read_bytes()


def test_a_chart_that_fails_fails_the_run(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir" / "c.png"
    pending = drawing.draw(confusion_matrix_png, MATRIX, CLASS_NAMES, missing, "t")
    with pytest.raises(FileNotFoundError):
        pending.path()


def test_when_the_worker_dies_the_run_draws_its_charts_itself(tmp_path: Path) -> None:
    os.kill(_worker_pid(), signal.SIGKILL)
    pending = drawing.draw(confusion_matrix_png, MATRIX, CLASS_NAMES, tmp_path / "c.png", "t")
    assert pending.path().stat().st_size > 0
    assert drawing.draw(os.getpid).path() == os.getpid()  # and so does every later chart


def _hang_in_worker(run_pid: int) -> int:
    """A chart that never finishes in the worker, and returns at once in the run's process."""
    if os.getpid() != run_pid:
        time.sleep(3600)
    return os.getpid()


def test_a_hung_worker_is_killed_and_the_run_draws_its_charts_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    worker = _worker_pid()
    monkeypatch.setattr(drawing, "CHART_TIMEOUT_S", 1.0)
    start = time.monotonic()
    assert drawing.draw(_hang_in_worker, os.getpid()).path() == os.getpid()
    assert time.monotonic() - start < 30
    with pytest.raises(ProcessLookupError):  # killed (and reaped by the pool)
        for _ in range(100):
            os.kill(worker, 0)
            time.sleep(0.1)
    assert drawing.draw(os.getpid).path() == os.getpid()  # and so is every later chart
    drawing.stop()  # returns: nothing waits for the hung chart


def test_without_the_worker_charts_are_drawn_here() -> None:
    assert drawing.draw(os.getpid).path() == os.getpid()


def test_a_worker_that_cannot_start_leaves_the_charts_to_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object) -> None:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(drawing.ProcessPoolExecutor, "submit", refuse)
    drawing.start()
    drawing.wait_started()
    assert drawing.draw(os.getpid).path() == os.getpid()


def test_a_failed_warm_up_does_not_stop_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    drawing.start()
    failed: Future = Future()
    failed.set_exception(RuntimeError("no fonts"))  # the warm-up's outcome, as if matplotlib had failed
    monkeypatch.setattr(drawing, "_started", failed)
    drawing.wait_started()  # logs, does not raise
    assert drawing.draw(os.getpid).path() != os.getpid()  # the worker still draws


def test_the_chart_modules_import_no_heavy_library() -> None:
    """The worker imports the modules whose functions it draws: if they pulled in MLflow or SciPy (the report
    package once did, 1.2 s), the sweep would wait for that import before its report."""
    chart_modules = ["resnet8ptq.plots", "resnet8ptq.report.figures"]
    heavy = ["mlflow", "sqlalchemy", "scipy", "torch", "onnxruntime", "tensorflow"]
    probe = f"import sys, {', '.join(chart_modules)}; print([m for m in {heavy!r} if m in sys.modules])"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
