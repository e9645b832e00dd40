"""A student's copy of the lessons: the notebooks, the examples and a short README, copied into
a folder of their own (`./kit lab` makes `workspace/`; `python -m ddp_kit lessons DIR` anywhere
the package is installed). The notebooks the kit ships stay the references that the tests run;
a student edits the copy, and `reset` brings back a fresh one, the old one kept in `backups/`.

A workspace's layout (paths as JupyterLab shows them):

    README.md        for students: what is here, how to reset
    notebooks/       00_introduction.ipynb ... (outputs cleared unless with_outputs=True)
    examples/        the plain scripts notebook 12 walks through (it reads ../examples)
    backups/<time>/  what a reset replaced, at the same paths

The lessons are read from the installed package (ddp_kit/lessons/, package data) or, in a
checkout of the repository, from its notebooks/ and examples/.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

PACKAGE_LESSONS = Path(__file__).resolve().parent / "lessons"
CHECKOUT = Path(__file__).resolve().parent.parent
FOLDERS = {"notebooks": "*.ipynb", "examples": "*.py"}  # a workspace's folders and their files
README = "README.md"
BACKUPS = "backups"
FIRST_NOTEBOOK = "notebooks/00_introduction.ipynb"


class WorkspaceError(Exception):
    """A request about lessons that cannot be done as asked; the message says what to do."""


def lesson_files() -> dict[str, Path]:
    """Every file a workspace starts with: {path in the workspace: the file it is copied from}."""
    files = {README: PACKAGE_LESSONS / README}
    for folder, pattern in FOLDERS.items():
        source = PACKAGE_LESSONS / folder
        if not source.is_dir():  # a checkout: the repository's own folders
            source = CHECKOUT / folder
        files.update({f"{folder}/{path.name}": path for path in sorted(source.glob(pattern))})
    if not any(name.startswith("notebooks/") for name in files):
        raise WorkspaceError(f"No lessons found in {PACKAGE_LESSONS} or {CHECKOUT}: reinstall "
                             "the kit's wheel (pip install ddp_kit-*.whl), or run pip install -e . "
                             "in its repository.")  # fmt: skip
    return files


def clear_outputs(notebook: dict) -> dict:
    """The notebook (nbformat JSON) as if never run: no outputs, execution counts or widget
    state; sources and tags kept."""
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
            cell.get("metadata", {}).pop("execution", None)
    notebook.get("metadata", {}).pop("widgets", None)
    return notebook


def copy_lesson(source: Path, target: Path, with_outputs: bool) -> None:
    """Copy one lesson file; a notebook loses its outputs unless `with_outputs`."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.suffix != ".ipynb" or with_outputs:
        shutil.copyfile(source, target)
        return
    notebook = clear_outputs(json.loads(source.read_text(encoding="utf-8")))
    target.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def copy_lessons(
    folder: str | Path, *, with_outputs: bool = False, overwrite: bool = False,
    missing_only: bool = False,
) -> list[str]:  # fmt: skip
    """Copy the lessons into `folder` (made if needed); the workspace paths copied.

    A lesson file already in `folder` is never replaced silently: the copy is refused, naming
    it, unless `overwrite` (replace it) or `missing_only` (keep it, copy only what is missing,
    e.g. a lesson added since the folder was made).
    """
    folder = Path(folder)
    files = lesson_files()
    present = [name for name in files if (folder / name).exists()]
    if present and not (overwrite or missing_only):
        raise WorkspaceError(
            f"{folder} already holds {len(present)} of the lesson files ({present[0]}, ...): "
            "they are kept. Choose another folder, add --missing to copy only the files it "
            "lacks, --overwrite to replace them, or reset it (`python -m ddp_kit reset "
            f"{folder}`), which keeps the old ones in {BACKUPS}/."
        )
    copied = [name for name in files if overwrite or name not in present]
    for name in copied:
        copy_lesson(files[name], folder / name, with_outputs)
    return copied


def find_lesson(name: str) -> str:
    """The workspace path of the lesson file `name` names: its path, file name, stem or
    number ("notebooks/08_allreduce.ipynb", "08_allreduce.ipynb", "08_allreduce", "08")."""
    files = lesson_files()
    wanted = Path(name).name
    number = _number(wanted)
    found = [path for path in files
             if wanted in (Path(path).name, Path(path).stem)
             or (number is not None and _number(Path(path).stem) == number)]  # fmt: skip
    if len(found) != 1:
        notebooks = ", ".join(Path(p).stem for p in files if p.startswith("notebooks/"))
        what = "matches several lessons" if found else "is not a lesson"
        raise WorkspaceError(f"{name!r} {what}. Name one of: {notebooks}, or README.md, or an "
                             "example such as examples/ddp_train.py.")  # fmt: skip
    return found[0]


def reset(
    folder: str | Path, lesson: str | None = None, *, with_outputs: bool = False
) -> tuple[list[str], Path | None]:
    """Fresh copies of one lesson file (`lesson`, as find_lesson reads it) or of every one.
    The copies they replace are moved to backups/<date_time>/ under `folder`, at the same
    paths. Returns the paths reset and the backup folder (None when nothing was replaced)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise WorkspaceError(f"{folder} is not a folder: make the workspace first "
                             f"(`python -m ddp_kit lessons {folder}`, or ./kit lab).")  # fmt: skip
    names = [find_lesson(lesson)] if lesson else list(lesson_files())
    backup = _new_backup_folder(folder)
    replaced = [name for name in names if (folder / name).exists()]
    for name in replaced:
        (backup / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.move(folder / name, backup / name)
    files = lesson_files()
    for name in names:
        copy_lesson(files[name], folder / name, with_outputs)
    return names, backup if replaced else None


def _new_backup_folder(folder: Path) -> Path:
    """backups/<date_time> under `folder`, with a suffix if a reset in the same second made it."""
    stamp = folder / BACKUPS / time.strftime("%Y-%m-%d_%H-%M-%S")
    backup, n = stamp, 1
    while backup.exists():
        n += 1
        backup = stamp.with_name(f"{stamp.name}-{n}")
    return backup


def _number(name: str) -> int | None:
    """A lesson's number: 8 for "08_allreduce", "08" or "8"; None for other names."""
    prefix = name.split("_", 1)[0]
    return int(prefix) if prefix.isdigit() else None
