"""No function of memgate is over 100 lines (issue 46): one that grows past it is split where
its parts have names, as `rest_admin.router` and `system.start_actors` were."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
AT_MOST = 100


def test_no_function_is_over_100_lines() -> None:
    longer = []
    for path in sorted((ROOT / "memgate").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > AT_MOST:
                    longer.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} {lines}")
    assert longer == []
