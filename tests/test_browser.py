"""End to end in a real browser: JupyterLab runs two notebooks in headless Chromium.

Needs /usr/bin/chromium (Debian's package) and the Python playwright package; CI installs
both and sets DDP_KIT_REQUIRE_BROWSER=1 so that a missing browser fails instead of skipping.
Screenshots go to artifacts/browser/<notebook>.png.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from ddp_kit.kernel.torchrun import free_port
from ddp_kit.shared.processes import stop_tree

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = ROOT / os.environ.get("DDP_KIT_ARTIFACTS", "artifacts") / "browser"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip

pytestmark = [pytest.mark.browser, pytest.mark.torchrun]


def _require_browser():
    missing = [] if CHROMIUM.exists() else [str(CHROMIUM)]
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("playwright")
    if missing and os.environ.get("DDP_KIT_REQUIRE_BROWSER"):
        pytest.fail(f"browser test required but missing: {missing}")
    if missing:
        pytest.skip(f"needs {missing} (apt-get install chromium; pip install playwright)")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab on 127.0.0.1 over a copy of the notebooks, with cell windowing off."""
    _require_browser()
    work = tmp_path_factory.mktemp("lab")
    for notebook in (ROOT / "notebooks").glob("*.ipynb"):
        shutil.copy(notebook, work)
    settings = work / ".settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)
    (settings / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    news = work / ".settings" / "@jupyterlab" / "apputils-extension"
    news.mkdir(parents=True)
    (news / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    token, port = secrets.token_hex(16), free_port()
    env = dict(os.environ, JUPYTERLAB_SETTINGS_DIR=str(work / ".settings"))
    env["DDP_KIT_PROGRESS"] = "1"  # a kernel as a student has it: launch progress shown
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root",
         "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
         f"--IdentityProvider.token={token}", "--LabApp.expose_app_in_browser=True",
         f"--ServerApp.root_dir={work}"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
            break
        except OSError:
            assert time.monotonic() < deadline, "JupyterLab did not start"
            time.sleep(0.5)
    yield base, token
    stop_tree(server.pid)


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


APP_READY = "(name) => window.jupyterapp?.shell.currentWidget?.context?.path === name"

RUN_ALL = """async () => {
    const app = window.jupyterapp;
    await app.started;
    await app.restored;
    const panel = app.shell.currentWidget;
    await panel.context.ready;
    await panel.sessionContext.ready;
    await app.commands.execute('notebook:run-all-cells');
}"""

CELLS = """() => {
    const panel = window.jupyterapp.shell.currentWidget;
    const cells = [];
    for (const cell of panel.content.model.cells) {
        if (cell.type === 'code') {
            cells.push({count: cell.executionCount, outputs: cell.outputs.toJSON()});
        }
    }
    return {cells, status: panel.sessionContext.session.kernel.status};
}"""


def run_notebook(page, base: str, token: str, name: str) -> list[dict]:
    """Open `name`, run all cells, wait until every code cell ran; return their outputs."""
    workspace = Path(name).stem  # a fresh workspace: no tab restored from an earlier page
    page.goto(f"{base}/lab/workspaces/{workspace}/tree/{name}?reset&token={token}")
    page.wait_for_function(APP_READY, arg=name, timeout=90000)
    page.evaluate(RUN_ALL)
    deadline = time.monotonic() + 240
    while True:
        state = page.evaluate(CELLS)
        if state["status"] == "idle" and all(c["count"] for c in state["cells"]):
            return state["cells"]
        assert time.monotonic() < deadline, f"{name} did not finish: {state}"
        time.sleep(0.2)  # a poll: the cells' state is read again


SCROLL_TO = """async (index) => {
    const notebook = window.jupyterapp.shell.currentWidget.content;
    try { await notebook.scrollToItem(index, 'start'); } catch (e) { /* older API: no scroll */ }
}"""


# Resolves once the browser has painted what the last script changed: two animation frames.
PAINTED = """() => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))"""


def screenshot(page, name: str, cell_index: int) -> None:
    """Save a screenshot with code cell number `cell_index` (counting all cells) at the top."""
    page.evaluate(SCROLL_TO, cell_index)
    page.evaluate(PAINTED)  # the scrolled notebook is on screen (not a guessed second)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"))


def outputs_of(cells: list[dict], output_type: str | None = None) -> list[dict]:
    return [o for c in cells for o in c["outputs"] if output_type in (None, o["output_type"])]


def check_clean(cells: list[dict], allowed_errors: int = 0) -> None:
    errors = outputs_of(cells, "error")
    assert len(errors) == allowed_errors, [e["evalue"][:300] for e in errors]
    stderr = [o["text"] for o in outputs_of(cells, "stream") if o["name"] == "stderr"]
    assert not stderr, stderr


def test_introduction_runs_in_jupyterlab(lab, browser):
    base, token = lab
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    cells = run_notebook(page, base, token, "00_introduction.ipynb")
    check_clean(cells)
    stdout = "".join(o["text"] for o in outputs_of(cells, "stream") if o["name"] == "stdout")
    for rank in range(4):
        assert f"[rank {rank}] hello from rank {rank} of 4" in stdout
    assert "[ranks 0-3] after all_reduce every rank holds 6" in stdout
    shown = [o["data"].get("text/plain", "") for o in outputs_of(cells, "display_data")]
    assert any(text.startswith("[ddp_kit] 4 ranks ran for") for text in shown), shown
    screenshot(page, "00_introduction", 5)  # the %%torchrun hello-world cell
    page.close()


def test_allreduce_notebook_shows_figures_and_a_live_step_explorer(lab, browser):
    base, token = lab
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    cells = run_notebook(page, base, token, "08_allreduce.ipynb")
    check_clean(cells)
    pngs = [o for o in outputs_of(cells) if "image/png" in o.get("data", {})]
    assert len(pngs) >= 3
    assert page.locator(".jp-OutputArea-output img").count() >= 3  # rendered, not just stored
    slider = page.locator(".widget-slider").first
    slider.wait_for(timeout=30000)
    image = page.locator(".jupyter-widgets img").first  # the explorer's figure
    image.scroll_into_view_if_needed()
    before = image.get_attribute("src")
    readout = page.locator(".widget-readout").first
    assert readout.inner_text().strip() == "0"
    slider.locator(".noUi-handle, .ui-slider-handle, [role=slider]").first.focus()
    page.keyboard.press("ArrowRight")
    page.wait_for_function(
        "(old) => document.querySelector('.jupyter-widgets img').src !== old", arg=before,
        timeout=30000,
    )  # fmt: skip
    assert readout.inner_text().strip() == "1"
    screenshot(page, "08_allreduce", 12)  # the step explorer
    page.close()
