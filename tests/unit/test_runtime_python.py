"""The in-sandbox runtime runs on the task image's system Python (3.10 on the Ubuntu 22.04 SWE-Gym images):
what it imports must parse as Python 3.10 and use only the standard library."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import sweflow

PKG = Path(sweflow.__file__).parent
RUNTIME_FILES = sorted([PKG / "__init__.py", *(PKG / "blackbox").glob("*.py")])


@pytest.mark.parametrize("path", RUNTIME_FILES, ids=lambda p: p.name)
def test_runtime_module_parses_as_python_3_10(path):
    ast.parse(path.read_text(), filename=str(path), feature_version=(3, 10))


@pytest.mark.parametrize("path", RUNTIME_FILES, ids=lambda p: p.name)
def test_runtime_module_imports_only_the_standard_library(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            assert top in sys.stdlib_module_names or top == "sweflow", f"{path.name} imports {name}"
            if top == "sweflow":
                assert name.startswith("sweflow.blackbox") or name == "sweflow", name
