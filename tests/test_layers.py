"""The package's shape, read from its import graph (import-linter and its ``grimp``, which see every import
statement, those inside functions included): imports point one way, down the layers named in pyproject.toml
and docs/architecture.md; no module imports itself through others (no cycle); no module over about 400 lines;
every error class in hcqr_dspy/errors.py; no two modules share a file name; no docstring or comment narrates the
code's history."""

import ast
import graphlib
import io
import re
import subprocess
import sys
import tokenize
from collections import defaultdict
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
    elsewhere = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "errors.py" and path.parent == PACKAGE:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and (node.name.endswith("Error") or node.name.endswith("Exception")):
                elsewhere.append(f"{path.relative_to(PACKAGE.parent)}: {node.name}")
    assert elsewhere == [], "error classes outside hcqr_dspy/errors.py: " + ", ".join(elsewhere)


def test_no_two_modules_share_a_file_name():
    """Each module's file name says what it holds, across the package: ``cli/index_command.py``, not a third
    ``index.py``."""
    where = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name not in ("__init__.py", "__main__.py"):
            where[path.name].append(str(path.relative_to(PACKAGE.parent)))
    shared = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert shared == {}, f"modules sharing a file name (name each for what it holds): {shared}"


# Phrases that tell the code's history instead of what it does (docstrings and comments only; messages to
# users are not read). "now" meaning "at run time" is fine and not listed.
HISTORY = re.compile(
    r"\b(earlier|older) (versions?|releases?)\b|\bold (versions?|folders|runs|formats?)\b"
    r"|\bbefore\b[^.;()]{0,80}\bexisted\b"
    r"|\bused to\b|\bno longer\b|\banymore\b|\bpreviously\b|\bformerly\b|\buntil recently\b"
    r"|\blegacy\b",
    re.IGNORECASE,
)


def prose(source: str) -> list[tuple[int, str]]:
    """``(line, text)`` of every docstring (a string standing alone as a statement) and comment in ``source``,
    whitespace collapsed to single spaces."""
    found = [
        (node.lineno, node.value.value)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    ]
    found += [
        (tok.start[0], tok.string)
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    ]
    return [(line, " ".join(text.split())) for line, text in found]


def test_no_docstring_or_comment_narrates_history():
    """Docstrings and comments say what the code does and why, never what it did ("used to", "no longer",
    "before X existed", "earlier versions")."""
    told = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: ...{text[max(0, m.start() - 40) : m.end() + 40]}..."
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, text in prose(path.read_text(encoding="utf-8"))
        if (m := HISTORY.search(text))
    ]
    assert told == [], "docstrings or comments that narrate history (say what the code does):\n" + "\n".join(told)


def test_no_module_imports_a_private_name_of_another():
    """A helper used by another module is public (no leading ``_``): ``from hcqr_dspy.cli.common import
    positive_int``, never ``_positive_int``."""
    private = [
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {node.module}.{alias.name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hcqr_dspy")
        for alias in node.names
        if alias.name.startswith("_") and not alias.name.startswith("__")
    ]
    assert private == [], "private names imported across modules (make them public): " + ", ".join(private)
