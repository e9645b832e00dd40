"""The students' workspace: a copy of the lessons (outputs cleared), reset with a backup, and
`./kit lab` serving it, never the reference notebooks the tests compare."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from ddp_kit import workspace
from ddp_kit.kernel.torchrun import free_port
from ddp_kit.shared.processes import stop_tree

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
LESSONS = len(workspace.lesson_files())  # README, notebooks, examples


def notebook(path: Path) -> dict:
    return json.loads(path.read_text())


def code_cells(nb: dict) -> list[dict]:
    return [cell for cell in nb["cells"] if cell["cell_type"] == "code"]


def test_a_copy_holds_every_lesson_with_outputs_cleared(tmp_path):
    copied = workspace.copy_lessons(tmp_path)
    assert "README.md" in copied and "examples/common.py" in copied
    assert [p for p in copied if p.startswith("notebooks/")] == [
        f"notebooks/{p.name}" for p in NOTEBOOKS
    ]
    for reference in NOTEBOOKS:
        copy, original = notebook(tmp_path / "notebooks" / reference.name), notebook(reference)
        assert [c["source"] for c in copy["cells"]] == [c["source"] for c in original["cells"]]
        assert all(c["outputs"] == [] and c["execution_count"] is None for c in code_cells(copy))
        assert "widgets" not in copy["metadata"]
    assert (tmp_path / "examples" / "ddp_train.py").read_text() == (
        ROOT / "examples" / "ddp_train.py"
    ).read_text()


def test_with_outputs_keeps_the_reference_outputs(tmp_path):
    workspace.copy_lessons(tmp_path, with_outputs=True)
    name = "00_introduction.ipynb"
    assert notebook(tmp_path / "notebooks" / name) == notebook(ROOT / "notebooks" / name)


def test_a_copy_never_replaces_a_students_file_unasked(tmp_path):
    workspace.copy_lessons(tmp_path)
    mine = tmp_path / "notebooks" / "03_model.ipynb"
    mine.write_text("my work")
    with pytest.raises(workspace.WorkspaceError, match=f"already holds {LESSONS} of the lesson"):
        workspace.copy_lessons(tmp_path)
    (tmp_path / "examples" / "common.py").unlink()  # as if added to the kit since
    assert workspace.copy_lessons(tmp_path, missing_only=True) == ["examples/common.py"]
    assert mine.read_text() == "my work"
    workspace.copy_lessons(tmp_path, overwrite=True)
    assert mine.read_text() != "my work"


def test_reset_brings_a_fresh_lesson_and_keeps_the_old_one(tmp_path):
    workspace.copy_lessons(tmp_path)
    edited = tmp_path / "notebooks" / "08_allreduce.ipynb"
    fresh = edited.read_text()
    edited.write_text("my work")
    names, backup = workspace.reset(tmp_path, "8")
    assert names == ["notebooks/08_allreduce.ipynb"] and edited.read_text() == fresh
    assert backup.parent == tmp_path / "backups"
    assert (backup / "notebooks" / "08_allreduce.ipynb").read_text() == "my work"
    names, second = workspace.reset(tmp_path)  # everything, the same second: its own folder
    assert len(names) == LESSONS and second != backup
    assert len(list(second.rglob("*.ipynb"))) == len(NOTEBOOKS)


@pytest.mark.parametrize(
    ("name", "found"),
    [("08", "notebooks/08_allreduce.ipynb"), ("13_communication_hooks", "notebooks/13_communi"
     "cation_hooks.ipynb"), ("workspace/notebooks/00_introduction.ipynb", "notebooks/00_intro"
     "duction.ipynb"), ("ddp_train.py", "examples/ddp_train.py")],
)  # fmt: skip
def test_a_lesson_is_named_by_path_name_or_number(name, found):
    assert workspace.find_lesson(name) == found


def test_the_command_line_refuses_with_one_clear_line(tmp_path):
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "ddp_kit", *args], capture_output=True,
                              text=True, cwd=tmp_path)  # fmt: skip

    made = run("lessons", "mine")
    assert made.returncode == 0, made.stderr
    assert (
        made.stdout
        == f"{LESSONS} lesson files copied into mine; start with notebooks/00_introduction.ipynb\n"
    )
    again = run("lessons", "mine")
    assert again.returncode == 2 and again.stdout == ""
    assert again.stderr.startswith(f"python -m ddp_kit lessons: mine already holds {LESSONS} of")
    assert "Traceback" not in again.stderr and again.stderr.count("\n") == 1
    unknown = run("reset", "mine", "99")
    assert unknown.returncode == 2 and "'99' is not a lesson. Name one of: 00_introduction" in (
        unknown.stderr
    )


def test_the_workspace_is_ignored_by_git():
    ignored = subprocess.run(["git", "check-ignore", "-q", "workspace/notebooks/00_x.ipynb"],
                             cwd=ROOT)  # fmt: skip
    assert ignored.returncode == 0


def git_status() -> str:
    return subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout  # fmt: skip


def api(base: str, token: str, path: str, body: dict | None = None) -> dict:
    request = urllib.request.Request(
        f"{base}{path}", method="PUT" if body else "GET",
        data=json.dumps(body).encode() if body else None,
        headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())


@pytest.fixture
def kit_lab(tmp_path):
    """`./kit lab` as a student starts it, over a workspace in tmp_path, on a free port."""
    token, port = secrets.token_hex(16), free_port()
    env = dict(os.environ, DDP_KIT_WORKSPACE=str(tmp_path / "workspace"))
    log = tmp_path / "lab.log"
    with log.open("w") as out:
        lab = subprocess.Popen(
            [str(ROOT / "kit"), "lab", "--no-browser", f"--ServerApp.port={port}",
             "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}"],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            api(base, token, "/api/status")
            break
        except OSError:
            assert lab.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
    yield base, token, tmp_path / "workspace", log
    stop_tree(lab.pid)


def test_kit_lab_serves_the_workspace_and_student_edits_stay_there(kit_lab):
    base, token, folder, log = kit_lab
    before = git_status()
    root = {item["name"] for item in api(base, token, "/api/contents")["content"]}
    assert root == {"README.md", "notebooks", "examples"}
    first = "notebooks/00_introduction.ipynb"
    said = log.read_text()
    assert f"/lab/tree/{first}?token=" in said  # Jupyter's own URL line, as the kit announced
    assert f"ending in\n  /lab/tree/{first}?token=...: the first lesson" in said
    news = api(base, token, "/lab/api/settings/@jupyterlab/apputils-extension:notification")
    defaults = news["schema"]["properties"]  # lab-config/'s overrides of JupyterLab's defaults
    assert defaults["fetchNews"]["default"] == "false"  # no "get notified about news?" pop-up
    assert defaults["checkForUpdates"]["default"] is False
    opened = api(base, token, f"/api/contents/{first}")
    assert all(cell["outputs"] == [] for cell in code_cells(opened["content"]))
    opened["content"]["cells"][0]["source"] = "my notes"  # what Lab's autosave writes
    api(base, token, f"/api/contents/{first}", {"type": "notebook", "format": "json",
                                                "content": opened["content"]})  # fmt: skip
    assert notebook(folder / first)["cells"][0]["source"] == ["my notes"]  # as nbformat saves it
    assert git_status() == before  # the reference notebooks are untouched
    reset = subprocess.run([str(ROOT / "kit"), "reset", "00"], capture_output=True, text=True,
                           env=dict(os.environ, DDP_KIT_WORKSPACE=str(folder)))  # fmt: skip
    assert reset.returncode == 0, reset.stderr
    assert reset.stdout.startswith(f"fresh {first} in {folder}; the old copy is in {folder}")
    assert notebook(folder / first)["cells"][0]["source"] != ["my notes"]
    backup = next((folder / "backups").glob(f"*/{first}"))
    assert notebook(backup)["cells"][0]["source"] == ["my notes"]
