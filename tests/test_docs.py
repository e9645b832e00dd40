"""The documentation points at things that exist: every relative link in README.md, docs/*.md
and the students' README reaches a file (and, with an anchor, a heading of that file), and
every `./kit COMMAND` they name is a command the `kit` script knows. Also: `./kit` alone prints
its help without making a virtual environment, and the README lists every notebook."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
KIT = ROOT / "kit"
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
STUDENTS = ROOT / "ddp_kit" / "lessons" / "README.md"
LINKED = [*DOCS, STUDENTS]

FENCE = re.compile(r"^```.*?^```[ \t]*$", re.S | re.M)
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
KIT_COMMAND = re.compile(r"\./kit[ \t]+([a-z][a-z0-9-]*)")


def prose(path: Path) -> str:
    """The file's text without its fenced code blocks (a link there is code, not a link)."""
    return FENCE.sub("", path.read_text(encoding="utf-8"))


def anchors(path: Path) -> set[str]:
    """The anchors GitHub makes for a Markdown file's headings (duplicates get -1, -2, ...)."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose(path).splitlines():
        heading = re.match(r"#{1,6}[ \t]+(.*?)[ \t#]*$", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def relative_links(path: Path) -> list[str]:
    targets = LINK.findall(prose(path))
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t, re.I)]


def kit_commands() -> set[str]:
    """The commands of the case statement at the end of `kit`."""
    text = KIT.read_text(encoding="utf-8")
    body = text[text.index('case "$command" in') : text.rindex("esac")]
    return {m for m in re.findall(r"^[ \t]+([a-z][a-z0-9-]*)\)", body, re.M)}


def test_the_documents_exist():
    names = {p.relative_to(ROOT).as_posix() for p in DOCS}
    assert {"README.md", "docs/kit.md", "docs/benchmark.md", "docs/teaching.md"} <= names
    assert STUDENTS.is_file()


@pytest.mark.parametrize("doc", LINKED, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_reach_a_file_and_heading(doc: Path):
    broken = []
    for target in relative_links(doc):
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            broken.append(f"{target}: no file {file.relative_to(ROOT)}")
        elif anchor and file.suffix == ".md" and anchor.lower() not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(ROOT)}")
    assert not broken, f"{doc.relative_to(ROOT)}: broken links:\n" + "\n".join(broken)


def test_the_front_door_links_onward():
    links = {t.partition("#")[0] for t in relative_links(ROOT / "README.md")}
    for doc in ("docs/kit.md", "docs/teaching.md", "docs/benchmark.md", "docs/reliability.md",
                "docs/upstream.md"):  # fmt: skip
        assert doc in links, f"README.md does not link {doc}"


def test_every_kit_command_named_exists():
    known = kit_commands()
    assert {"lab", "test", "reset", "gpu-check"} <= known
    unknown = [
        f"{doc.relative_to(ROOT)}: ./kit {name}"
        for doc in LINKED
        for name in KIT_COMMAND.findall(doc.read_text(encoding="utf-8"))
        if name not in known
    ]
    assert not unknown, "commands `kit` does not know:\n" + "\n".join(unknown)


def test_kit_alone_prints_its_help_without_a_venv(tmp_path: Path):
    venv = tmp_path / "venv"
    env = {**os.environ, "DDP_KIT_VENV": str(venv), "DDP_KIT_WORKSPACE": str(tmp_path / "ws")}
    done = subprocess.run(["bash", str(KIT)], capture_output=True, text=True, env=env,
                          timeout=10)  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stdout.splitlines()
    assert lines and all(line.startswith("./kit ") for line in lines), done.stdout
    helped = {line.split()[1] for line in lines}
    assert helped == kit_commands(), "kit's help lines and its case statement differ"
    assert not venv.exists() and not (tmp_path / "ws").exists()


def test_the_readme_lists_every_notebook():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    rows = set(re.findall(r"^\| `(\d\d_\w+)` \|", readme, re.M))
    notebooks = {p.stem for p in (ROOT / "notebooks").glob("*.ipynb")}
    assert notebooks <= rows, f"notebooks missing from README.md: {sorted(notebooks - rows)}"
