"""The package's layout is its architecture: code that runs in a rank never reaches the
kernel's machinery, and every subpackage ships in the wheel."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from support import build_wheel

PACKAGE = Path(__file__).resolve().parent.parent / "ddp_kit"
IN_RANKS = ["worker", "toy", "observe", "traffic", "scratch", "speedup", "facts", "link",
            "profiling", "costmodel"]  # fmt: skip


def rank_modules() -> list[Path]:
    """Every module that runs inside a rank: rank/, shared/ and the student's in-rank API."""
    paths = [*(PACKAGE / "rank").glob("*.py"), *(PACKAGE / "shared").glob("*.py")]
    return sorted(paths + [PACKAGE / f"{name}.py" for name in IN_RANKS] + [PACKAGE / "__init__.py"])


def imported(path: Path) -> set[str]:
    """The absolute names of the ddp_kit modules that `path` imports (at any depth)."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if path.name != "__init__.py":
        package = package.rsplit(".", 1)[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            name = "." * node.level + (node.module or "")
            base = importlib.util.resolve_name(name, package) if node.level else name
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {name for name in names if name.startswith("ddp_kit")}


@pytest.mark.parametrize("path", rank_modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_code_that_runs_in_a_rank_imports_nothing_of_the_kernel(path):
    assert path.exists(), path
    reached = sorted(name for name in imported(path) if name.startswith("ddp_kit.kernel"))
    assert not reached, f"{path.relative_to(PACKAGE)} imports {reached}"


def test_the_ast_check_sees_relative_imports():
    assert "ddp_kit.kernel.session" in imported(PACKAGE / "kernel" / "magic.py")
    assert "ddp_kit.shared.contract" in imported(PACKAGE / "rank" / "server.py")


def test_importing_the_rank_api_loads_no_kernel_module():
    modules = (
        "ddp_kit.worker, ddp_kit.observe, ddp_kit.link, ddp_kit.profiling, "
        "ddp_kit.rank.runner, ddp_kit.rank.server"
    )
    found = "[m for m in sys.modules if m.startswith('ddp_kit.kernel')]"
    code = f"import sys, {modules}\nprint({found})"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_every_module_and_lesson_ships_in_the_wheel(tmp_path):
    with zipfile.ZipFile(build_wheel(tmp_path)) as archive:
        names = set(archive.namelist())
    root = PACKAGE.parent
    modules = {str(p.relative_to(root)) for p in PACKAGE.rglob("*.py")}
    lessons = {f"ddp_kit/lessons/{p.relative_to(root)}"
               for p in [*root.glob("notebooks/*.ipynb"), *root.glob("examples/*.py")]}  # fmt: skip
    assert {name for name in names if name.endswith(".py")} == modules | {
        name for name in lessons if name.endswith(".py")
    }
    assert lessons | {"ddp_kit/lessons/README.md"} <= names
