"""End to end through the MLflow UI: `mlflow server` on a small store, looked at in headless Chromium.

Chromium is driven over the DevTools protocol with aiohttp (an mlflow dependency): no WebDriver needed.
Without /usr/bin/chromium (Debian package `chromium`) the tests skip, except in CI (`CI` set) where they fail.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from mlflow.entities import Run, RunTag
from mlflow.tracking import MlflowClient

from resnet8ptq.tracking.store import runs_page
from tests.integration.servers import chromium_binary, mlflow_server, stop

pytestmark = [pytest.mark.browser, pytest.mark.server, pytest.mark.slow]

VIEWPORT = (1920, 1000)
SWEEP = ("-m", "backend=onnx", "dtype=int8,uint8", "report.enabled=false")
FAILED = "onnx-uint8-int8-entropy-pt"  # added by hand: a failed run as the pipeline leaves one


@pytest.fixture(scope="module", autouse=True)
def chromium() -> str:
    """Debian's Chromium, checked before anything starts."""
    return chromium_binary()


class Browser:
    """A headless Chromium page driven over the Chrome DevTools Protocol (synchronous wrapper)."""

    def __init__(self, binary: str, profile: Path) -> None:
        self._process = subprocess.Popen(
            [
                binary,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--remote-debugging-port=0",
                f"--user-data-dir={profile}",
                f"--window-size={VIEWPORT[0]},{VIEWPORT[1]}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._loop = asyncio.new_event_loop()
        self._message_id = 0
        try:
            self._loop.run_until_complete(self._connect(profile / "DevToolsActivePort"))
        except BaseException:
            self.close()
            raise
        width, height = VIEWPORT
        self.send(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )

    async def _connect(self, port_file: Path) -> None:
        self._session = aiohttp.ClientSession()
        deadline = time.monotonic() + 30
        while not (port_file.is_file() and port_file.read_text().strip()):
            if self._process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"Chromium did not start its DevTools endpoint (exit {self._process.poll()})"
                )
            await asyncio.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        async with self._session.get(f"http://127.0.0.1:{port}/json/list") as response:
            page = next(target for target in await response.json() if target["type"] == "page")
        self._socket = await self._session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)

    async def _call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self._message_id += 1
        await self._socket.send_json({"id": self._message_id, "method": method, "params": params})
        while True:  # skip events until our answer
            message = json.loads((await asyncio.wait_for(self._socket.receive(), 60)).data)
            if message.get("id") == self._message_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        """One DevTools command; its result."""
        return self._loop.run_until_complete(self._call(method, params))

    def js(self, expression: str) -> Any:
        """Evaluate JavaScript in the page; its value."""
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 120, what: str = "") -> Any:
        """Poll a JavaScript expression until it is truthy; its value."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if value := self.js(
                f"(() => {{ try {{ return {expression}; }} catch (e) {{ return null; }} }})()"
            ):
                return value
            time.sleep(0.25)
        text = self.js("document.body ? document.body.innerText : ''") or ""
        raise AssertionError(f"timed out waiting for {what or expression}; page text: {text[:1500]!r}")

    def open(self, url: str) -> None:
        self.send("Page.navigate", url=url)

    def text(self) -> str:
        return self.js("document.body.innerText")

    def screenshot(self, path: Path) -> Path:
        path.write_bytes(base64.b64decode(self.send("Page.captureScreenshot", format="png")["data"]))
        return path

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if hasattr(self, "_socket"):
                self._loop.run_until_complete(self._socket.close())
        with contextlib.suppress(Exception):
            self._loop.run_until_complete(self._session.close())
        self._loop.close()
        stop(self._process, grace=15)


@dataclass
class Store:
    uri: str
    experiment_id: str
    parent: str
    parent_name: str
    children: dict[str, Run]  # run name -> run


@pytest.fixture(scope="module")
def store(run_cli, tmp_path_factory: pytest.TempPathFactory) -> Store:
    """What a user has after `python run.py -m backend=onnx dtype=int8,uint8`, plus a failed run."""
    workdir = tmp_path_factory.mktemp("ui-store")
    result = run_cli(workdir, *SWEEP)
    assert result.returncode == 0, result.stderr[-3000:]
    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment_id = client.get_experiment_by_name("resnet8ptq").experiment_id
    (parent,) = client.search_runs([experiment_id], "tags.sweep = 'true'")
    tags = {"mlflow.parentRunId": parent.info.run_id, "backend": "onnx", "quantized": "true"}
    failed = client.create_run(experiment_id, run_name=FAILED, tags=tags).info.run_id
    client.log_batch(failed, tags=[RunTag("error", "RuntimeError: calibration diverged")])
    client.set_terminated(failed, "FAILED")
    children = client.search_runs([experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    return Store(
        uri, experiment_id, parent.info.run_id, parent.info.run_name, {r.info.run_name: r for r in children}
    )


@pytest.fixture(scope="module")
def server(store: Store, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`mlflow server` on 127.0.0.1 with a free port, serving the store; its base URL once /health answers."""
    with mlflow_server(store.uri, tmp_path_factory.mktemp("ui-server") / "server.log", timeout=180) as url:
        yield url


@pytest.fixture(scope="module")
def browser(chromium: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    page = Browser(chromium, tmp_path_factory.mktemp("chromium-profile"))
    yield page
    page.close()


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ui-screenshots")


def _row(run_id: str) -> str:
    return f"document.querySelector('[role=row][row-id=\"{run_id}\"]')"


def test_runs_table_groups_the_sweep_and_shows_datasets_models_and_metrics(
    store: Store, server: str, browser: Browser, screenshots: Path
) -> None:
    """The link the sweep prints opens the runs table (Model training view), the parent row named after the
    sweep's overrides; expanded, each child shows its datasets, its model and its metrics."""
    browser.open(runs_page(store.experiment_id, server))
    browser.wait_for(
        f"document.body.innerText.includes({store.parent_name!r})", what="the sweep's parent run"
    )
    browser.js("document.querySelectorAll('button[aria-label=Close]').forEach(b => b.click())")  # assistant
    assert store.parent_name.startswith(" ".join(SWEEP[1:]) + " @ ")
    count = f"{len(store.children) + 1} matching runs"
    browser.wait_for(f"document.body.innerText.includes({count!r})", what=count)
    collapsed = browser.js(
        "[...document.querySelectorAll('[role=row][row-id]')].map(r => r.getAttribute('row-id'))"
    )
    assert set(collapsed) == {store.parent}, "children start folded under their parent"

    browser.js(f"{_row(store.parent)}.querySelector('[col-id*=\"Run Name\"] button').click()")  # expander
    browser.wait_for(
        " && ".join(f"!!{_row(run.info.run_id)}" for run in store.children.values()), what="child runs"
    )
    # Nested: each child's name sits further right than the parent's.
    name_x = (
        "(id) => document.querySelector(`[role=row][row-id='${id}'] a[href*='/runs/']`)"
        ".getBoundingClientRect().left"
    )
    parent_x = browser.js(f"({name_x})({json.dumps(store.parent)})")
    column = "(id, c) => document.querySelector(`[role=row][row-id='${id}'] [col-id='${c}']`)?.innerText"
    for name, run in store.children.items():
        run_id = json.dumps(run.info.run_id)
        assert browser.js(f"({name_x})({run_id})") > parent_x + 10, f"{name} is not indented"
        datasets = browser.js(f"({column})({run_id}, 'attributes.`Dataset`')")
        models = browser.js(f"({column})({run_id}, 'attributes.`Models`')")
        if name == FAILED:
            assert (datasets, models) == ("-", "-")
            continue
        assert "cifar10-test" in datasets and "Evaluation" in datasets, (name, datasets)
        assert models == name, "the model is named after its run"
        if run.data.tags["quantized"] == "true":
            assert "+1" in datasets, "the calibration sample is the run's second dataset"

    # Show the accuracy and size metric columns (Columns menu), then read the cells.
    browser.js("document.querySelector('[data-testid=column-selection-dropdown]').click()")
    for metric in ("accuracy", "model_size_bytes"):
        checkbox = (
            f"document.querySelector('.du-bois-light-tree-node-content-wrapper[title={metric}]')"
            ".parentElement.querySelector('.du-bois-light-tree-checkbox')"
        )
        browser.wait_for(f"!!{checkbox}", what=f"metric {metric} in the Columns menu")
        browser.js(f"{checkbox}.click()")
    for key in ("keyDown", "keyUp"):
        browser.send(
            "Input.dispatchKeyEvent", type=key, key="Escape", code="Escape", windowsVirtualKeyCode=27
        )
    cell = (
        "(id, m) => document.querySelector(`[role=row][row-id='${id}'] [col-id='metrics.\\`${m}\\`']`)"
        "?.innerText"
    )
    for name, run in store.children.items():
        run_id = json.dumps(run.info.run_id)
        for metric in ("accuracy", "model_size_bytes"):
            value = run.data.metrics.get(metric)
            got = browser.wait_for(f"({cell})({run_id}, {metric!r})", what=f"{metric} of {name}")
            expected = "-" if value is None else f"{value:g}" if metric == "accuracy" else str(int(value))
            assert got == expected, (name, metric, got, expected)
    time.sleep(0.5)
    path = browser.screenshot(screenshots / "mlflow_runs_table.png")
    print(f"screenshot: {path}")


def test_child_run_page_links_its_parent_and_lists_metrics(
    store: Store, server: str, browser: Browser, screenshots: Path
) -> None:
    run = store.children["onnx-int8-int8-minmax-pt"]
    run_id = run.info.run_id
    accuracy = f"{run.data.metrics['accuracy']:g}"
    browser.open(f"{server}/#/experiments/{store.experiment_id}/runs/{run_id}")
    browser.wait_for(f"document.body.innerText.includes({accuracy!r})", what="the run's accuracy")
    text = browser.text()
    size = str(int(run.data.metrics["model_size_bytes"]))
    assert "onnx-int8-int8-minmax-pt" in text and "accuracy" in text and size in text
    link = browser.wait_for(f"document.querySelector('a[href$=\"/runs/{store.parent}\"]')?.innerText")
    assert link == store.parent_name, "the child links to its sweep as parent run"
    assert "Parent run" in text
    print(f"screenshot: {browser.screenshot(screenshots / 'mlflow_child_run.png')}")


def test_failed_run_shows_failed(store: Store, server: str, browser: Browser) -> None:
    run_id = store.children[FAILED].info.run_id
    browser.open(f"{server}/#/experiments/{store.experiment_id}/runs/{run_id}")
    browser.wait_for("document.body.innerText.includes('calibration diverged')", what="the error tag")
    assert "Failed" in browser.text()
