"""The package's shape, read from its import graph (import-linter and its ``grimp``, which see every import
statement, those inside functions included): imports point one way, down the layers named in pyproject.toml
and docs/architecture.md; no module imports itself through others (no cycle); no module over about 400 lines;
every error class in hcqr_dspy/errors.py."""

import graphlib
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "hcqr_dspy"

MAX_LINES = 400
# A file may be longer when it is one job that reads best whole (its reason beside it).
LONG_FILES: dict[str, str] = {}


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("hcqr_dspy", cache_dir=None)


def test_imports_point_down_the_layers():
    """The layers contract of pyproject.toml ([tool.importlinter]), checked by import-linter's own command."""
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint), "--no-cache"], cwd=PACKAGE.parent, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "Contracts: 1 kept, 0 broken." in done.stdout


def test_no_import_cycle(graph):
    # a package's __init__ importing its own submodules is how a package exposes them, not a cycle
    edges = {
        m: {
            i
            for i in graph.find_modules_directly_imported_by(m)
            if not (m.count(".") < i.count(".") and i.startswith(m + "."))
        }
        for m in graph.modules
    }
    try:
        graphlib.TopologicalSorter(edges).prepare()
    except graphlib.CycleError as exc:
        pytest.fail(f"import cycle: {' -> '.join(exc.args[1])}")


def test_no_file_over_about_400_lines():
    long = {
        str(p.relative_to(PACKAGE.parent)): n
        for p in sorted(PACKAGE.rglob("*.py"))
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
        and str(p.relative_to(PACKAGE.parent)) not in LONG_FILES
    }
    assert long == {}, f"files over {MAX_LINES} lines (split them, or give a reason in LONG_FILES): {long}"


def test_every_error_class_lives_in_errors_py():
    import ast

    elsewhere = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "errors.py" and path.parent == PACKAGE:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and (node.name.endswith("Error") or node.name.endswith("Exception")):
                elsewhere.append(f"{path.relative_to(PACKAGE.parent)}: {node.name}")
    assert elsewhere == [], "error classes outside hcqr_dspy/errors.py: " + ", ".join(elsewhere)
