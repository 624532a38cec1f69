"""MLflow's usage telemetry is off in every process the tool starts (issue #30): it phones home, and on an
offline machine its config thread (``GetTelemetryConfig``) unsets an environment variable while the first
REST call to a tracking server may be walking ``os.environ``, which fails that call at random.

Each check runs in a fresh interpreter (MLflow reads the switch once, when imported) with a minimal
environment: none of the variables that turn telemetry off by themselves (``MLFLOW_DISABLE_TELEMETRY``,
``DO_NOT_TRACK``, and the CI and pytest markers MLflow takes as "testing", ``PYTEST_CURRENT_TEST`` among
them). The probes are short ``python -c`` imports (no data, no model): about 4 s together.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

import resnet8ptq

REPO = Path(__file__).resolve().parents[2]

# Runs an entry point until it first imports mlflow, then prints MLFLOW_DISABLE_TELEMETRY as it is at that
# moment (mlflow itself is not imported: it would take seconds).
_UNTIL_MLFLOW = """
import importlib.abc, os, pickle, runpy, sys

class MlflowImported(BaseException):
    pass

class Stop(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "mlflow":
            raise MlflowImported(os.environ.get("MLFLOW_DISABLE_TELEMETRY"))

sys.meta_path.insert(0, Stop())
sys.argv = ["entry", "--help"]
try:
    {entry}
except MlflowImported as imported:
    print("at mlflow import:", imported.args[0])
else:
    print("mlflow not imported")
"""

ENTRY_POINTS = {
    "run.py": "runpy.run_path('run.py', run_name='__main__')",
    "report CLI": "runpy.run_module('resnet8ptq.report', run_name='__main__', alter_sys=True)",
    # A launcher's job (joblib's workers, submitit's processes) starts by unpickling its task, which run.py's
    # `main` reaches by reference: this is the opcode that imports resnet8ptq.app and takes `task` from it.
    "launcher job": "pickle.loads(b'cresnet8ptq.app\\ntask\\n.')",
}


def _fresh_python(code: str, tmp_path: Path) -> str:
    env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", str(tmp_path))}
    env["XDG_CONFIG_HOME"] = str(tmp_path)  # where MLflow's telemetry client would write its installation id
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip()


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_telemetry_is_off_before_an_entry_point_imports_mlflow(entry: str, tmp_path: Path) -> None:
    output = _fresh_python(_UNTIL_MLFLOW.format(entry=ENTRY_POINTS[entry]), tmp_path)
    assert output == "at mlflow import: true"


def test_mlflow_starts_no_telemetry_client_after_the_package(tmp_path: Path) -> None:
    """The switch is MLflow's own: imported after the package, MLflow makes no telemetry client (whose first
    event would start the ``GetTelemetryConfig`` thread) and writes no installation id."""
    probe = (
        "import threading, resnet8ptq, mlflow, mlflow.telemetry;"
        "print(mlflow.telemetry.get_telemetry_client(), [t.name for t in threading.enumerate()"
        " if 'Telemetry' in t.name])"
    )
    assert _fresh_python(probe, tmp_path) == "None []"
    assert not (tmp_path / "mlflow" / "telemetry.json").exists()


def test_the_user_can_turn_telemetry_back_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "false")
    importlib.reload(resnet8ptq)
    assert os.environ["MLFLOW_DISABLE_TELEMETRY"] == "false"
    monkeypatch.delenv("MLFLOW_DISABLE_TELEMETRY")
    importlib.reload(resnet8ptq)
    assert os.environ["MLFLOW_DISABLE_TELEMETRY"] == "true"  # monkeypatch restores the variable afterwards
