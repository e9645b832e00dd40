"""Every exercise's solution (tests/solutions.py) makes its notebook's check say "Correct!", and
a wrong answer, run first as a student would, makes it say "Not quite" or "Not yet".

Only the cells an exercise needs are run, from the notebook's folder (as Jupyter runs it), in one
kernel for the whole module whose namespace is emptied (`%reset -f`) before each group: the
notebooks without live ranks together, then each live-ranks notebook, whose live ranks are
stopped after it. (One kernel: each fresh one would import torch again for its fork server.)"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from solutions import EXERCISES, Exercise

pytestmark = [pytest.mark.torchrun, pytest.mark.slow]

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
HERE = [e for e in EXERCISES if e.tested_in == "tests/test_solutions.py"]
GROUPS = {"no live ranks": [e for e in HERE if not e.live]}
GROUPS.update({e.notebook: [x for x in HERE if x.notebook == e.notebook] for e in HERE if e.live})


def text_of(outputs: list[dict]) -> str:
    """What a cell printed and displayed (errors included, so a failure shows them)."""
    parts = []
    for output in outputs:
        if output["output_type"] == "stream":
            parts.append(output["text"])
        elif output["output_type"] == "error":
            parts.append(f"{output['ename']}: {output['evalue']}")
        else:
            parts.append(output.get("data", {}).get("text/plain", ""))
    return "".join(parts)


class Kernel:
    """A kernel started in the notebooks' folder that runs cells given as source text."""

    def __init__(self, client: NotebookClient) -> None:
        self.client = client

    def run(self, source: str) -> str:
        cell = nbformat.v4.new_code_cell(source)
        self.client.nb.cells.append(cell)
        self.client.execute_cell(cell, len(self.client.nb.cells) - 1)
        return text_of(cell.outputs)


def edited(exercise: Exercise, source: str, answer: str) -> str:
    assert source.count(exercise.edit) == 1, (exercise.notebook, exercise.cell, exercise.edit)
    return source.replace(exercise.edit, answer)


@pytest.fixture(scope="module")
def kernel():
    client = NotebookClient(nbformat.v4.new_notebook(), timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS)}})  # fmt: skip
    with client.setup_kernel():
        yield Kernel(client)


@pytest.mark.parametrize("group", list(GROUPS))
def test_solutions_pass_their_checks_and_wrong_answers_fail(group, kernel):
    kernel.run("%reset -f")  # no variable of an earlier group: each needs only its own cells
    done: set = set()
    live = any(e.live for e in GROUPS[group])
    try:
        for exercise in GROUPS[group]:
            notebook = nbformat.read(NOTEBOOKS / f"{exercise.notebook}.ipynb", as_version=4)
            cells = [cell.source for cell in notebook.cells]
            for index in exercise.setup:
                if (exercise.notebook, index) not in done:
                    kernel.run(cells[index])
                    done.add((exercise.notebook, index))
            source = cells[exercise.cell]
            answers = [("wrong", edited(exercise, source, exercise.wrong))]
            for number, (text, replacement) in enumerate(exercise.more_wrong):
                assert source.count(text) == 1, (exercise.notebook, exercise.cell, text)
                answers.append((f"wrong {number + 2}", source.replace(text, replacement)))
            answers.append(("right", edited(exercise, source, exercise.right)))
            where = f"{exercise.notebook} cell {exercise.cell}"
            for name, answer in answers:
                said = kernel.run(answer)
                for index in exercise.check:
                    said = kernel.run(cells[index])
                if name == "right":
                    assert "Correct!" in said, (where, said)
                else:
                    assert "Correct!" not in said and ("Not quite" in said or "Not yet" in said), (
                        where, name, said,
                    )  # fmt: skip
        if live:
            assert "live ranks stopped" in kernel.run("%ranks stop")
    finally:
        if live:
            kernel.run("%ranks stop")  # (again, harmless) also when the group failed
