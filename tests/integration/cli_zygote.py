"""`python run.py ARGS` for the tests, without paying the libraries' import at every call.

A test's CLI call spent about 6 of its 10 s importing MLflow, PyTorch, ONNX Runtime, Hydra, pandas and
matplotlib before any work (a refusal: 10.7 s as a new interpreter, 3.7 s forked; one core of the AVX2-only
AMD EPYC). The *zygote* (Android's name for the pattern) is a process that imports them once and then forks
a child per call: the child takes the call's working directory, environment, argv and output files, runs
`run.py` as ``__main__`` exactly as `python run.py` would (its exit hooks, its exit status; a Python error
exits 1 with its traceback), and exits. Its launchers' jobs (joblib, submitit, Ray) still start new
interpreters.

What a fork cannot give: settings read while the libraries are imported (PYTHONPATH, the allocator's and
the kernels' variables, a hash seed of its own). :func:`needs_fresh_interpreter` sends a call whose
environment changes any of those to a new interpreter instead, as does a test that asks for one
(``run_cli(..., fresh=True)``): tests of start-up itself.

Run as ``python -m tests.integration.cli_zygote`` from the repository root: requests are JSON lines on stdin
(``id``, ``argv``, ``cwd``, ``env``, ``out``, ``err``), answers JSON lines on stdout (``{"id", "pid"}`` when a
child starts, ``{"id", "code"}`` when it ends).
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import runpy
import select
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from concurrent.futures import Future
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUN_PY = str(REPO / "run.py")
PRELOADED = (
    "hydra",
    "omegaconf",
    "torch",
    "onnxruntime",
    "onnx2torch",
    "pandas",
    "matplotlib.pyplot",
    "mlflow",
    "mlflow.store.tracking.sqlalchemy_store",
    "mlflow.onnx",
    "mlflow.pyfunc",
    "resnet8ptq.config",
    "resnet8ptq.app",
    "resnet8ptq.pipeline",
    "resnet8ptq.backends.onnx.backend",
    "resnet8ptq.backends.torch.backend",  # torchao: 3 s of a torch run's start
    "resnet8ptq.backends.tflite.backend",
    "resnet8ptq.report.writer",
    "resnet8ptq.report.figures",
)
"""What a run imports before its work (python -X importtime run.py), each backend's included: imported once,
in the zygote. Never TensorFlow: the package runs it in child processes of its own."""
READ_AT_START = ("PYTHON", "MALLOC_", "GLIBC_", "LD_", "ATEN_", "ONEDNN_", "DNNL_", "OMP_", "MKL_", "KMP_")
"""Prefixes of the variables the interpreter, the allocator or the libraries read when they load."""


def needs_fresh_interpreter(env: dict[str, str], base: dict[str, str]) -> bool:
    """Whether ``env`` differs from the zygote's ``base`` in a variable read at start-up."""
    names = {name for name in env.keys() | base.keys() if name.startswith(READ_AT_START)}
    return any(env.get(name) != base.get(name) for name in names)


# ----------------------------------------------------------------------------------------------- the server


def _child(request: dict) -> None:
    """In the forked child: become `python run.py ARGV` in the request's directory and environment."""
    code = 1
    try:
        os.setsid()  # its own process group: a timeout kills it with the jobs it started
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        for fd, path in ((1, request["out"]), (2, request["err"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        atexit._clear()  # the zygote's exit hooks are not the run's
        sys.argv = [RUN_PY, *request["argv"]]
        sys.path[0] = str(REPO)  # as `python run.py` has it: the script's directory first
        try:
            runpy.run_path(RUN_PY, run_name="__main__")
            code = 0
        except SystemExit as stop:
            if stop.code is None or isinstance(stop.code, int):
                code = stop.code or 0
            else:
                print(stop.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
        atexit._run_exitfuncs()  # run.py's last hook leaves here (os._exit) after a success
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def serve() -> None:
    """Import :data:`PRELOADED`, then fork a child per request until stdin closes."""
    import importlib

    for name in PRELOADED:
        importlib.import_module(name)
    if threading.active_count() != 1:  # a fork copies no thread: a library must not have started one
        raise RuntimeError(f"threads started while importing: {threading.enumerate()}")
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # a stray print of the zygote goes to stderr, never into the answers
    running: dict[int, object] = {}
    requests = sys.stdin.buffer
    pending = b""
    open_ = True
    while open_ or running:
        ready, _, _ = select.select([requests] if open_ else [], [], [], 0.05)
        if ready:
            chunk = os.read(requests.fileno(), 65536)
            open_ = bool(chunk)
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in filter(None, lines):
                request = json.loads(line)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    answers.close()
                    _child(request)
                running[pid] = request["id"]
                print(json.dumps({"id": request["id"], "pid": pid}), file=answers)
        while running:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            print(
                json.dumps({"id": running.pop(pid), "code": os.waitstatus_to_exitcode(status)}), file=answers
            )


# ----------------------------------------------------------------------------------------------- the client


class Zygote:
    """The test side: starts the server with ``env`` and runs calls through it, several at a time."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = dict(env)
        self._scratch = Path(tempfile.mkdtemp(prefix="cli-zygote-"))
        self._log = self._scratch / "zygote.log"  # its own messages (import warnings, a failure)
        with self._log.open("w") as log:
            self._server = subprocess.Popen(
                [sys.executable, "-m", "tests.integration.cli_zygote"],
                cwd=REPO,
                env=self.env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                bufsize=1,
            )
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._started: dict[int, Future] = {}
        self._ended: dict[int, Future] = {}
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self._server.stdout:
            answer = json.loads(line)
            with self._lock:
                if "pid" in answer:
                    self._started.pop(answer["id"]).set_result(answer["pid"])
                else:
                    self._ended.pop(answer["id"]).set_result(answer["code"])
        with self._lock:  # the server is gone: every waiting call learns it, with the end of its log
            for future in [*self._started.values(), *self._ended.values()]:
                future.set_exception(RuntimeError(f"the CLI zygote exited: {self._log.read_text()[-3000:]}"))

    def run(
        self, args: list[str], cwd: Path, env: dict[str, str], timeout: float
    ) -> subprocess.CompletedProcess:
        """Like ``subprocess.run([python, run.py, *args], capture_output=True, text=True, timeout=...)``."""
        ident = next(self._ids)
        out, err = self._scratch / f"{ident}.out", self._scratch / f"{ident}.err"
        started, ended = Future(), Future()
        with self._lock:
            self._started[ident], self._ended[ident] = started, ended
            request = {
                "id": ident,
                "argv": list(args),
                "cwd": str(cwd),
                "env": env,
                "out": str(out),
                "err": str(err),
            }
            self._server.stdin.write(json.dumps(request) + "\n")
            self._server.stdin.flush()
        pid = started.result(timeout=300)  # the first call waits for the imports
        command = [sys.executable, RUN_PY, *args]
        try:
            code = ended.result(timeout=timeout)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            ended.result(timeout=60)
            raise subprocess.TimeoutExpired(command, timeout, out.read_text(), err.read_text()) from None
        stdout, stderr = (path.read_text(errors="replace") for path in (out, err))
        out.unlink()
        err.unlink()
        return subprocess.CompletedProcess(command, code, stdout, stderr)

    def close(self) -> None:
        self._server.stdin.close()
        self._server.wait(timeout=120)
        self._reader.join(timeout=10)
        for path in self._scratch.iterdir():
            path.unlink()
        self._scratch.rmdir()


if __name__ == "__main__":
    serve()
