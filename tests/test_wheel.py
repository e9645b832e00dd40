"""The kit as a class outside this repository gets it (Colab, JupyterHub, conda): the built
wheel installed into a fresh venv that has torch, the lessons copied out of the package, and
notebooks run there in that venv's own kernel: 00 (%%torchrun), 12 (launch() over the
examples it reads from ../examples) and 16 (live ranks).

The fresh venv has torch as Colab's Python has it: already there, before the kit. It sees
the suite's own torch, and the packages torch needs, through a .pth file (symlinks to them,
nothing else), so pip finds torch installed and resolves everything else the wheel asks for
itself. Installing torch's 1 GB again cost this test over half its time (issue #40)."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import nbformat
import pytest
import torch
from packaging.requirements import Requirement
from support import WORKERS, build_wheel

from ddp_kit import workspace

pytestmark = [pytest.mark.torchrun, pytest.mark.slow]

NOTEBOOKS = ["00_introduction", "12_from_one_process_to_ddp", "16_mixed_precision"]
EXPECTED = {  # a line each notebook prints when it ran as it should
    "00_introduction": "after all_reduce every rank holds 6",
    "12_from_one_process_to_ddp": "resumed weights == uninterrupted weights: True",
    "16_mixed_precision": "the bf16 autocast loss is within 1 % of the float32 loss",
}


def run(*command: str | Path, cwd: Path) -> str:
    """Run a command outside the repository, with no path into it; its output. Python may
    write bytecode there (as on Colab): pip installs without compiling all of torch (23 s
    less), and each module is compiled once, when it is first imported."""
    dropped = ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    done = subprocess.run([str(part) for part in command], cwd=cwd, env=env,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, f"{command}:\n{done.stdout}\n{done.stderr[-3000:]}"
    return done.stdout


def printed(notebook: nbformat.NotebookNode) -> str:
    return "".join(output.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
                   for output in cell.outputs)  # fmt: skip


def torch_and_what_it_needs() -> list[metadata.Distribution]:
    """The installed distributions of torch and of everything it requires, transitively."""
    found: dict[str, metadata.Distribution] = {}
    wanted = ["torch"]
    while wanted:
        name = wanted.pop()
        key = name.lower().replace("_", "-")
        if key in found:
            continue
        found[key] = dist = metadata.distribution(name)
        for line in dist.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                wanted.append(requirement.name)
    return list(found.values())


def lend_torch(python: Path, folder: Path) -> None:
    """Let the venv of `python` see this suite's torch and what torch needs: `folder` gets a
    symlink to each of their top-level files and folders (their .dist-info included), and the
    venv's site-packages a .pth file naming `folder`."""
    folder.mkdir()
    for dist in torch_and_what_it_needs():
        tops = {Path(str(file)).parts[0] for file in dist.files or []} - {".."}
        for top in tops:
            target = Path(dist.locate_file(top))
            if target.exists():
                (folder / top).symlink_to(target)
    (site_packages(python) / "suite_torch.pth").write_text(f"{folder}\n")


def site_packages(python: Path) -> Path:
    """The site-packages folder of the venv whose interpreter is `python`."""
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return Path(run(python, "-c", code, cwd=python.parent).strip())


def test_the_wheel_runs_the_lessons_in_a_fresh_venv(tmp_path):
    wheel = build_wheel(tmp_path)
    venv = tmp_path / "venv"
    python = venv / "bin" / "python"
    run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    lend_torch(python, tmp_path / "lent")
    torch_spec = f"torch=={torch.__version__.split('+')[0]}"  # the torch this suite runs on
    installed = run(python, "-m", "pip", "install", "--no-compile", torch_spec, wheel,
                    "nbclient", "ipykernel", cwd=tmp_path)  # fmt: skip
    assert f"Requirement already satisfied: {torch_spec}" in installed  # the lent torch
    said = run(python, "-m", "ddp_kit", "lessons", "class", cwd=tmp_path)
    assert said == (f"{len(workspace.lesson_files())} lesson files copied into class; start with "
                    "notebooks/00_introduction.ipynb\n")  # fmt: skip
    lessons = tmp_path / "class"
    paths = [lessons / "notebooks" / f"{name}.ipynb" for name in NOTEBOOKS]
    run(python, WORKERS / "execute_notebooks.py", *paths, cwd=tmp_path)
    site = site_packages(python)
    for name, path in zip(NOTEBOOKS, paths, strict=True):
        executed = nbformat.read(path, as_version=4)
        kernel_python, kit = executed.cells[0].outputs[0]["text"].split()
        assert kernel_python == str(python) and kit == f"{site}/ddp_kit/__init__.py"
        errors = [o for c in executed.cells if c.cell_type == "code" for o in c.outputs
                  if o.output_type == "error"]  # fmt: skip
        assert not errors and EXPECTED[name] in printed(executed), name
