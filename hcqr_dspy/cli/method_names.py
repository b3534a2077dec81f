"""The method names the commands offer (``--method``, ``compile --program``), without importing the methods.

``hcqr --help`` and every command's parser must not import DSPy (seconds). The built-in methods are read
from the source files of :mod:`hcqr_dspy.programs`: each registers with ``register_method("name")``
(:mod:`hcqr_dspy.programs.method_registry`), a call whose name is a string literal, found here with Python's
``ast`` (about 20 small files, read once per process). Methods registered in this process by modules
imported before the parser is built (a plugin, a test) are added once the registry is loaded; nothing here
loads it. The names are not parser ``choices``: the command checks ``--method`` when it runs, against the
registry itself, and names the registered methods in its one-line error.
"""

from __future__ import annotations

import ast
import sys
from functools import cache
from pathlib import Path

PROGRAMS_DIR = Path(__file__).resolve().parents[1] / "programs"
REGISTRY = "hcqr_dspy.programs.method_registry"


def method_names() -> tuple[str, ...]:
    """Every method name: the built-in ones (:func:`builtin_method_names`) and those registered in this
    process so far (when the registry is loaded), in name order (A to Z)."""
    names = set(builtin_method_names())
    registry = sys.modules.get(REGISTRY)
    if registry is not None:
        names.update(registry.PROGRAMS)
    return tuple(sorted(names))


@cache
def builtin_method_names(folder: Path = PROGRAMS_DIR) -> tuple[str, ...]:
    """The names given to ``register_method("name")`` in the ``.py`` files of ``folder`` (default: the
    programs package), in name order. Where the folder holds no source (an install of compiled files only),
    the registry is imported and its names returned."""
    files = sorted(folder.glob("*.py"))
    if not files:
        from hcqr_dspy.programs.method_registry import PROGRAMS  # no source to read: the registry itself (seconds)

        return tuple(PROGRAMS)
    names: set[str] = set()
    for path in files:
        text = path.read_text(encoding="utf-8")
        if "register_method(" in text:
            names.update(registered_names(ast.parse(text, filename=str(path))))
    return tuple(sorted(names))


def registered_names(tree: ast.AST) -> list[str]:
    """The string-literal first arguments of the ``register_method(...)`` calls in a module's syntax tree
    (as a decorator or called on a class), in source order."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        first = node.args[0]
        if called == "register_method" and isinstance(first, ast.Constant) and isinstance(first.value, str):
            found.append((node.lineno, node.col_offset, first.value))
    return [name for *_, name in sorted(found)]
