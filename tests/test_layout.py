"""The package's layout is its architecture: code that runs in a rank never reaches the
kernel's machinery, and every subpackage ships in the wheel."""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from support import build_wheel

PACKAGE = Path(__file__).resolve().parent.parent / "ddp_kit"
# The flat modules that run only in the notebook (or the command line) and so may use the
# kernel's machinery; every other flat module, a new one included, is checked as in-rank code.
NOTEBOOK_SIDE = {"plots", "comparisons", "widgets", "exercises", "reference", "environment",
                 "tracing", "workspace", "__main__"}  # fmt: skip


def flat_modules() -> set[str]:
    return {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}


def documented_sides() -> dict[str, set[str]]:
    """The flat modules that ddp_kit/__init__.py's table places "In the ranks", "In the
    notebook" and "In both" (a name at the start of one of its columns)."""
    doc = ast.get_docstring(ast.parse((PACKAGE / "__init__.py").read_text()))
    table = doc.split("Where each module runs")[1].split("kernel/")[0]
    sides: dict[str, set[str]] = {}
    for block in re.split(r"^In ", table, flags=re.M)[1:]:
        heading, _, body = block.partition("\n")
        names = re.findall(r"(?:^ +|  )([a-z_]+(?:, [a-z_]+)*)(?=  )", body, flags=re.M)
        sides[heading.split(",")[0].rstrip(":")] = {
            name for group in names for name in group.split(", ") if name in flat_modules()
        }
    return sides


def rank_modules() -> list[Path]:
    """Every module that runs inside a rank: rank/, shared/, every flat module not on the
    notebook side, and ddp_kit/__init__.py (whose import every rank's `import ddp_kit...` runs)."""
    paths = [*(PACKAGE / "rank").glob("*.py"), *(PACKAGE / "shared").glob("*.py")]
    flat = [PACKAGE / f"{name}.py" for name in flat_modules() - NOTEBOOK_SIDE]
    return sorted(paths + flat + [PACKAGE / "__init__.py"])


def imported(path: Path, module_level: bool = False) -> set[str]:
    """The absolute names of the ddp_kit modules that `path` imports (at any depth; with
    module_level, only those its import runs: not inside a function)."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    package = ".".join(parts[:-1])  # a relative import resolves against the module's package
    names = set()
    for node in _nodes(ast.parse(path.read_text()), module_level):
        if isinstance(node, ast.ImportFrom):
            name = "." * node.level + (node.module or "")
            base = importlib.util.resolve_name(name, package) if node.level else name
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {name for name in names if name.startswith("ddp_kit")}


def _nodes(tree: ast.AST, module_level: bool):
    """Every node of `tree`; with module_level, none inside a function's body."""
    for node in ast.iter_child_nodes(tree):
        yield node
        if not (module_level and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))):
            yield from _nodes(node, module_level)


@pytest.mark.parametrize("path", rank_modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_code_that_runs_in_a_rank_imports_nothing_of_the_kernel(path):
    assert path.exists(), path
    # ddp_kit/__init__.py's functions (the IPython extension, the lazy public names) reach
    # the kernel by design; importing it must not
    names = imported(path, module_level=path == PACKAGE / "__init__.py")
    reached = sorted(name for name in names if name.startswith("ddp_kit.kernel"))
    assert not reached, f"{path.relative_to(PACKAGE)} imports {reached}"


def test_the_in_rank_check_covers_every_module_the_package_says_runs_in_the_ranks():
    sides = documented_sides()
    assert set(sides) == {"the ranks", "the notebook", "both"}
    assert {"worker", "divergence", "link", "profiling"} <= sides["the ranks"]  # the parser
    in_ranks = sides["the ranks"] | sides["both"]
    checked = {p.stem for p in rank_modules()}
    assert in_ranks <= checked, f"not checked: {sorted(in_ranks - checked)}"
    # the notebook-side allow-list holds only modules documented there (or the command line)
    assert NOTEBOOK_SIDE <= sides["the notebook"] | {"workspace", "__main__"}
    assert NOTEBOOK_SIDE <= flat_modules()
    documented = set().union(*sides.values()) | {"workspace", "__main__"}  # the command line
    assert flat_modules() <= documented, f"not in the table: {sorted(flat_modules() - documented)}"


def test_the_ast_check_sees_relative_imports():
    assert "ddp_kit.kernel.session" in imported(PACKAGE / "kernel" / "magic.py")
    assert "ddp_kit.shared.contract" in imported(PACKAGE / "rank" / "server.py")
    # an __init__.py's "." is its own package: ddp_kit/__init__.py's extension imports magic
    init = PACKAGE / "__init__.py"
    assert "ddp_kit.kernel.magic" in imported(init)
    assert not any(name.startswith("ddp_kit.kernel") for name in imported(init, True))


def test_importing_the_rank_api_loads_no_kernel_module():
    flat = sorted(f"ddp_kit.{name}" for name in flat_modules() - NOTEBOOK_SIDE)
    modules = ", ".join([*flat, "ddp_kit.rank.runner", "ddp_kit.rank.server"])
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
