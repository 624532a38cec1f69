"""The run explorer (explore/runs.py) on the store of the session's three-toolchain sweep (the `sweeps`
fixture: ONNX Runtime, PyTorch and TFLite int8 per-channel with their layer analysis, MLPerf Tiny's model, the
FP32 baselines, device=integer; it costs these tests nothing when the suite runs it anyway): run headless by
`marimo export html`, which runs every cell, with no cell raising; and served by `marimo run`, looked at in
headless Chromium as test_mlflow_ui.py looks at the MLflow UI: the layer view shows each toolchain's weights.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow.entities import Run

from tests.integration.conftest import REPO, Sweeps
from tests.integration.servers import chromium_binary, free_port, served
from tests.integration.test_mlflow_ui import Browser

pytestmark = [pytest.mark.browser, pytest.mark.server]

NOTEBOOK = REPO / "explore" / "runs.py"
MARIMO = Path(sys.executable).with_name("marimo")
LAYER = "conv2d_7_1"  # opened by the URL (?layer=): the 64x64x3x3 convolution, 36,864 weights
DEEP = """
const deepAll = (selector, root = document) => {
  let found = [...root.querySelectorAll(selector)];
  for (const element of root.querySelectorAll('*'))
    if (element.shadowRoot) found = found.concat(deepAll(selector, element.shadowRoot));
  return found;
};
const deepText = (root = document) => [root.body ? root.body.innerText : root.textContent,
  ...[...root.querySelectorAll('*')].filter(e => e.shadowRoot).map(e => deepText(e.shadowRoot))].join(' ');
"""
"""marimo draws each output in a web component's shadow root: these look inside them."""


def deep(expression: str) -> str:
    return f"(() => {{ {DEEP} return {expression}; }})()"


@pytest.fixture(scope="module")
def store(sweeps: Sweeps) -> str:
    return f"sqlite:///{sweeps.workdir / 'mlflow.db'}"


@pytest.fixture(scope="module")
def quantized(sweeps: Sweeps) -> dict[str, Run]:
    """backend -> its quantized run (not MLPerf Tiny's published model)."""
    runs = {}
    for run in sweeps.children:
        if run.data.tags.get("quantized") == "true" and "reference" not in run.data.tags:
            runs[run.data.tags["backend"]] = run
    assert set(runs) == {"onnx", "torch", "tflite"}
    return runs


def title(run: Run) -> str:
    """What the layer view calls a run."""
    return f"{run.info.run_name} ({run.data.tags['backend']}, {run.info.run_id[:8]})"


@pytest.fixture(scope="module")
def marimo_env(cli_env: dict[str, str]) -> dict[str, str]:
    """The test assets (thumbnails) and converted-model cache, no update check."""
    return {**cli_env, "MARIMO_SKIP_UPDATE_CHECK": "1"}


def test_notebook_runs_headless_with_no_cell_raising(
    store: str, quantized: dict[str, Run], marimo_env: dict[str, str], tmp_path: Path
) -> None:
    """Every cell runs (layers of the three toolchains, two runs side by side with thumbnails, the sweep's
    maps) and none raises: `marimo export html` exits non-zero and says so when one does. The page holds the
    outputs only (no code), so what it is checked for was drawn."""
    out = tmp_path / "explore.html"
    export = [str(MARIMO), "export", "html", "--no-include-code", str(NOTEBOOK), "-o", str(out)]
    result = subprocess.run(
        [*export, "--", "--tracking-uri", store],
        env=marimo_env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "cells failed" not in result.stderr, result.stderr[-3000:]
    page = out.read_text()
    for backend, run in quantized.items():
        assert title(run) in page, f"no layer figure of the {backend} run"
    for reader in ("onnx-qdq", "torch-pt2e"):  # the layer table's readers (TFLite's is "tflite")
        assert reader in page
    assert "stored integers" in page and "test images" in page  # layer charts; two runs' thumbnails
    for run in quantized.values():  # each in a bit-width map's cell, linking to its run
        assert f"#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}" in page


@pytest.fixture(scope="module")
def chromium() -> str:
    return chromium_binary()


@pytest.fixture(scope="module")
def app(store: str, marimo_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`marimo run` serving the explorer on 127.0.0.1 with a free port; its URL once it answers."""
    port = free_port()
    log = tmp_path_factory.mktemp("explorer") / "marimo.log"
    command = [str(MARIMO), "run", str(NOTEBOOK), "--headless", "--host", "127.0.0.1", "--port", str(port)]
    url = f"http://127.0.0.1:{port}"
    arguments = [*command, "--", "--tracking-uri", store]
    with served(arguments, log, url, f"marimo run on {url}", env=marimo_env, timeout=180, grace=10):
        yield url


def test_app_shows_each_toolchains_layer(
    app: str, quantized: dict[str, Run], chromium: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The app opens on the newest quantized run of each toolchain and shows, for the layer the URL names,
    its integer and dequantized weight histograms (with the FP32 weights) and per-channel scales."""
    browser = Browser(chromium, tmp_path_factory.mktemp("chromium-profile"))
    try:
        browser.open(f"{app}/?layer={LAYER}")
        browser.wait_for(
            deep("deepAll('.js-plotly-plot').length >= 3"), timeout=300, what="three layer figures"
        )
        text = browser.js(deep("deepText()"))
        for backend, run in quantized.items():
            assert title(run) in text, f"no layer figure of the {backend} run"
        for label in ("stored integers", "dequantized (q - zp)·scale vs FP32", "per-channel scale"):
            assert label in text, label
        chosen = "deepAll('select').map(s => s.selectedOptions[0]?.text || '')"
        assert any(option.startswith(f"{LAYER} (") for option in browser.js(deep(chosen))), (
            "not the URL's layer"
        )
        browser.js(deep("deepAll('[role=tablist]')[0].scrollIntoView()"))
        path = browser.screenshot(tmp_path_factory.mktemp("explorer-screenshots") / "explorer_layers.png")
        print(f"screenshot: {path}")
    finally:
        browser.close()
