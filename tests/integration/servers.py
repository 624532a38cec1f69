"""Helpers for tests that run local servers: free ports, waiting for readiness, `mlflow server`, shutdown."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


def free_port() -> int:
    """A local TCP port nobody listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(
    check: Callable[[], bool],
    timeout: float,
    what: str,
    log: Path | None = None,
    process: subprocess.Popen | None = None,
) -> None:
    """Poll ``check`` until true; fail the test with the log's tail if ``process`` exits or time runs out."""
    deadline = time.monotonic() + timeout
    while not check():
        if (process is not None and process.poll() is not None) or time.monotonic() > deadline:
            detail = log.read_text()[-3000:] if log and log.is_file() else ""
            pytest.fail(f"{what} did not come up within {timeout:.0f} s:\n{detail}")
        time.sleep(0.3)


def stop(process: subprocess.Popen, sig: int = signal.SIGTERM, grace: float = 20) -> None:
    """End a process started in its own session, and its children (its process group): ``sig``, then
    SIGKILL after ``grace`` seconds."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(5)


@contextlib.contextmanager
def mlflow_server(
    backend_store_uri: str,
    log: Path,
    *extra_args: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 120,
    grace: float = 15,
    port: int | None = None,
) -> Iterator[str]:
    """`mlflow server` on 127.0.0.1 with ``port`` (default: a free one) and one worker, output to ``log``;
    yields its base URL once /health answers (fails the test with the log's tail if it exits or is not
    healthy within ``timeout`` seconds) and stops its process group on exit."""
    port = port or free_port()
    mlflow_cli = Path(sys.executable).with_name("mlflow")
    command = [str(mlflow_cli)] if mlflow_cli.is_file() else [sys.executable, "-m", "mlflow"]
    args = ["server", "--backend-store-uri", backend_store_uri, *extra_args]
    args += ["--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    url = f"http://127.0.0.1:{port}"
    with served([*command, *args], log, f"{url}/health", f"mlflow server on {url}", cwd, env, timeout, grace):
        yield url


def answers(url: str) -> bool:
    """Whether ``url`` answers HTTP 200 now."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def served(
    command: list[str],
    log: Path,
    ready_url: str,
    what: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 120,
    grace: float = 20,
) -> Iterator[subprocess.Popen]:
    """Start ``command`` in its own session, output to ``log``; yield its process once ``ready_url`` answers
    (fail the test with the log's tail if it exits or does not answer within ``timeout`` seconds); stop its
    process group on exit."""
    with log.open("w") as out:
        process = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        wait_until(lambda: answers(ready_url), timeout, what, log, process)
        yield process
    finally:
        stop(process, grace=grace)


CHROMIUM = "/usr/bin/chromium"


def chromium_binary() -> str:
    """Debian's Chromium: skip the test when absent, fail it in CI (`CI` set), which must provide it."""
    binary = shutil.which("chromium") or (CHROMIUM if Path(CHROMIUM).is_file() else None)
    if binary is None:
        message = "headless Chromium not found: install the Debian package `chromium`"
        if os.environ.get("CI"):
            pytest.fail(f"{message} (CI must provide it)")
        pytest.skip(message)
    return binary
