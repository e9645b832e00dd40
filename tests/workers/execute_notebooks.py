"""`PYTHON execute_notebooks.py NOTEBOOK...`: execute each notebook in place, in a fresh kernel
of PYTHON's own (jupyter_client starts the "python3" kernel with the Python running this), from
the notebook's folder, as Jupyter would. A first cell, added, prints which Python and which
ddp_kit the kernel ran. A cell that raises stops with nbclient's error (exit status 1)."""

import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

PROBE = "import sys, ddp_kit\nprint(sys.executable)\nprint(ddp_kit.__file__)"

for path in map(Path, sys.argv[1:]):
    notebook = nbformat.read(path, as_version=4)
    notebook.cells.insert(0, nbformat.v4.new_code_cell(PROBE))
    client = NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})  # fmt: skip
    client.execute()
    nbformat.write(notebook, path)
