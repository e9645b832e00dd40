"""Prints where a rank looks for imports, and what it found: run from a notebook's folder that
holds helper.py and a datautils.py of its own (test_imports_and_arguments)."""

import sys

import datautils
from helper import WHERE

print("path", *sys.path[:2])
print("helper from", WHERE)
print("datautils from", datautils.__file__.rsplit("/", 1)[0])
print("argv", sys.argv[1:])
