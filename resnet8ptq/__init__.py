"""resnet8ptq.

Importing the package turns MLflow's usage telemetry off for this process and the processes it starts,
unless the user has set ``MLFLOW_DISABLE_TELEMETRY`` (``false`` turns it back on). Every entry point imports
the package before ``mlflow``: ``run.py``, a launcher's job (unpickling its task imports the package), the
report CLI. MLflow reads the switch when it is imported; with telemetry on, a background thread fetches
its config from the internet and, when that fails (offline machines), unsets an environment variable while
the first REST call to a tracking server may be walking ``os.environ``: that call then fails at random.

It also turns off MLflow's uv detection (``MLFLOW_UV_AUTO_DETECT``, ``MLFLOW_LOG_UV_FILES``), unless set:
run from this repository (a uv project), MLflow would copy its 200 KB ``uv.lock`` and ``pyproject.toml``
into every logged model and swap the requirements each model states for the whole project's; the tool
states each model's own (``MlflowFlavor.requirements``).
"""

import os

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("MLFLOW_UV_AUTO_DETECT", "false")
os.environ.setdefault("MLFLOW_LOG_UV_FILES", "false")
