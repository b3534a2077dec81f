"""Validated configuration files: YAML or JSON read into pydantic models, every problem one line.

Experiment files (:class:`hcqr_dspy.workflows.experiment_file.Experiment`), optimizer recipes
(:class:`hcqr_dspy.optimize.recipes.Recipe`) and saved-program metadata
(:class:`hcqr_dspy.optimize.saved.ProgramMeta`) are pydantic v2 models: unknown
keys are refused, types are checked strictly (``budget: "15"``, ``limit:
zero`` or ``budget: yes`` are errors, not coerced) and ranges by
``Field`` constraints. This module reads such a file and turns any problem
into one line that names the file, the line where it stands (for YAML), the
field and what is allowed, e.g.::

    experiments/grid.yaml:5: budget: Input should be greater than or equal to 1 (got -3)
    experiments/grid.yaml:7: questions.limt: unknown key; allowed: ids, limit, seed
    optimizers/r.yaml:3: not valid UTF-8 text (byte 0xe9 at column 14); save the file as UTF-8

Keyword arguments of a callable (an optimizer's settings, a method's
options) are checked by :func:`check_arguments` against a model built from
the callable's signature (:func:`keyword_model`).
"""

from __future__ import annotations

import functools
import inspect
import math
import types
import typing
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar, Union

import typing_extensions
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, create_model

from hcqr_dspy.errors import HCQRError

M = TypeVar("M", bound=BaseModel)


# -- reading --------------------------------------------------------------------------------------
def read_text(path: Path, error: type[HCQRError], what: str) -> str:
    """A file's text, decoded as UTF-8.

    Raises:
        error: unreadable (missing, a folder, no permission), or not UTF-8 (the line and column of the
            first bad byte are named).
    """
    try:
        if path.exists() and not path.is_dir() and not path.is_file():  # a FIFO or device: reading it would block
            raise error(f"cannot read {what} {path}: not a regular file")
        data = path.read_bytes()
    except OSError as exc:
        raise error(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise error(
            f"{path}:{line}: not valid UTF-8 text (byte 0x{data[exc.start]:02x} at column {column}); "
            "save the file as UTF-8"
        ) from None


def read_json(path: str | Path, error: type[HCQRError], what: str, hint: str = "") -> Any:
    """Parse a JSON file (:func:`read_text` first).

    Raises:
        error: unreadable, not UTF-8, or not JSON (``file:line: not valid JSON (...)``, then ``hint``).
    """
    import json

    path = Path(path)
    text = read_text(path, error, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{path}:{exc.lineno}: not valid JSON ({exc.msg}){'; ' + hint if hint else ''}") from None


def read_yaml(path: str | Path, error: type[HCQRError], what: str) -> tuple[Any, Any]:
    """Parse a YAML file (PyYAML's safe loader).

    Returns:
        ``(data, node)``: the plain data and the root of the YAML node tree (``None`` for an empty
        file), which :func:`validate` uses to name the line of a field.

    Raises:
        error: see :func:`read_text`; not valid YAML (line and problem named); a key repeated in
            one mapping (YAML's last-one-wins would silently drop the first).
    """
    import yaml

    path = Path(path)
    text = read_text(path, error, what)
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        _refuse_repeated_keys(node, path, error)
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise error(f"{where}: not valid YAML ({problem})") from None
    finally:
        loader.dispose()
    return data, node


def _refuse_repeated_keys(node: Any, path: Path, error: type[HCQRError]) -> None:
    import yaml

    if isinstance(node, yaml.MappingNode):
        seen: set[Any] = set()
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode):
                if key.value in seen:
                    raise error(f"{path}:{key.start_mark.line + 1}: key {key.value!r} appears twice in one mapping")
                seen.add(key.value)
            _refuse_repeated_keys(value, path, error)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _refuse_repeated_keys(item, path, error)


def line_of(node: Any, loc: Iterable[Any]) -> int | None:
    """1-based line of the field at ``loc`` (a pydantic error location) in a YAML node tree.

    The deepest part of ``loc`` found in the tree is named (a missing key: its mapping's line).
    """
    import yaml

    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next(
                ((k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == str(part)), None
            )
            if match is None:
                break
            line, node = match[0].start_mark.line + 1, match[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line


# -- validating -----------------------------------------------------------------------------------
def validate(
    model: type[M],
    data: Any,
    where: str | Path,
    error: type[HCQRError],
    node: Any = None,
    context: dict[str, Any] | None = None,
) -> M:
    """``model.model_validate(data, context=context)`` with a one-line error.

    Args:
        model: The pydantic model.
        data: Parsed file content.
        where: The file, named in the error.
        error: The error class to raise.
        node: The YAML node tree from :func:`read_yaml`, for line numbers.
        context: Pydantic validation context (e.g. the folder relative paths are resolved against).

    Raises:
        error: ``"<file>:<line>: <field>: <what is wrong and what is allowed>"``, for the first problem,
            with how many more there are.
    """
    if not isinstance(data, dict):
        raise error(
            f"{where}: expected a mapping of keys ({', '.join(allowed_keys(model, ()) or [])}), "
            f"got {type(data).__name__ if data is not None else 'an empty file'}"
        )
    try:
        return model.model_validate(data, context=context)
    except ValidationError as exc:
        raise error(describe(exc, where, model, node)) from None


def describe(exc: ValidationError, where: str | Path, model: type[BaseModel] | None = None, node: Any = None) -> str:
    """One line for a pydantic ``ValidationError``: its first problem and the count of the others."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    loc = tuple(first["loc"])
    line = line_of(node, loc) if node is not None else None
    place = f"{where}:{line}" if line else str(where)
    text = f"{place}: {problem_line(first, model, loc)}"
    if len(errors) > 1:
        text += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    return text


def problem_line(error: dict[str, Any], model: type[BaseModel] | None, loc: tuple) -> str:
    field = ".".join(str(p) for p in loc)
    kind = error["type"]
    if kind == "extra_forbidden":
        allowed = allowed_keys(model, loc[:-1]) if model is not None else None
        message = "unknown key" + (f"; allowed: {', '.join(allowed)}" if allowed else "")
    elif kind == "missing":
        message = "required"
    elif kind in ("value_error", "assertion_error"):
        message = str(error["ctx"]["error"])
    else:
        message = f"{error['msg']} (got {_shown(error.get('input'))})"
        if kind == "float_type" and _yaml_text_number(error.get("input")):
            message += "; YAML reads a number in exponent form without a decimal point as text: write 5.0e-2, not 5e-2"
    return f"{field}: {message}" if field else message


def _yaml_text_number(value: Any) -> bool:
    """Whether ``value`` is text that Python reads as a finite number in exponent form (``5e-2``), which YAML 1.1,
    as PyYAML implements it, takes for a string."""
    if not isinstance(value, str) or "e" not in value.lower():
        return False
    try:
        return math.isfinite(float(value))
    except ValueError:
        return False


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def allowed_keys(model: Any, loc: Iterable[Any]) -> list[str] | None:
    """The keys a model (or a TypedDict within it) takes at ``loc``; ``None`` where that is not a fixed set."""
    current: Any = model
    for part in loc:
        fields = _fields(current)
        if fields is None or str(part) not in fields:
            return None
        current = _structured(fields[str(part)])
    fields = _fields(current)
    return sorted(fields) if fields is not None else None


def _fields(tp: Any) -> dict[str, Any] | None:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return {name: f.annotation for name, f in tp.model_fields.items()}
    if typing_extensions.is_typeddict(tp):
        return typing.get_type_hints(tp)
    return None


def _structured(tp: Any) -> Any:
    """The model or TypedDict inside an annotation (``X | None``, ``Annotated[X, ...]``), else ``tp``."""
    if typing.get_origin(tp) is typing.Annotated:
        return _structured(typing.get_args(tp)[0])
    if typing.get_origin(tp) in (Union, types.UnionType):
        for arg in typing.get_args(tp):
            if _fields(_structured(arg)) is not None:
                return _structured(arg)
    return tp


# -- keyword arguments of a callable -----------------------------------------------------------------
def keyword_model(functions: tuple[Callable, ...], exclude: frozenset[str]) -> type[BaseModel]:
    """A pydantic model of the keyword arguments of ``functions`` (the first one naming a parameter wins).

    Each parameter is typed by its annotation (string annotations are evaluated in the function's
    module); an unannotated one by the type of its default when that is a ``bool``, ``int``, ``float``
    or ``str``, else it takes anything. Union members that pydantic cannot check (protocols, callables)
    cannot come from a file and are dropped; a parameter left with none, or whose string annotation
    cannot be evaluated, takes anything. Validation is
    strict (no ``"5"`` for an ``int``, no ``true`` for a number) and unknown names are refused.
    """
    return _keyword_model(tuple(functions), frozenset(exclude))


@functools.cache
def _keyword_model(functions: tuple[Callable, ...], exclude: frozenset[str]) -> type[BaseModel]:
    fields: dict[str, Any] = {}
    unresolved: dict[str, Any] = {}
    for fn in functions:
        for p in _parameters(fn):
            if p.name in exclude or p.name in fields or p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
                continue
            annotation = p.annotation
            if isinstance(annotation, str):  # not resolvable here: a later function may declare it resolvably
                unresolved.setdefault(p.name, None if p.default is p.empty else p.default)
                continue
            if annotation is p.empty:
                annotation = type(p.default) if type(p.default) in (bool, int, float, str) else Any
            fields[p.name] = (_checkable(annotation), None if p.default is p.empty else p.default)
    for name, default in unresolved.items():
        fields.setdefault(name, (Any, default))
    name = "_".join(getattr(fn, "__qualname__", "fn").replace(".", "_") for fn in functions[:1])
    config = ConfigDict(extra="forbid", strict=True, arbitrary_types_allowed=True)
    return create_model(f"Arguments_{name}", __config__=config, **fields)


def _parameters(fn: Callable) -> list[inspect.Parameter]:
    try:
        return list(inspect.signature(fn, eval_str=True).parameters.values())
    except (NameError, TypeError, SyntaxError):  # an annotation that names something its module does not import
        return list(inspect.signature(fn).parameters.values())


def _checkable(annotation: Any) -> Any:
    if _builds(annotation):
        return annotation
    if typing.get_origin(annotation) in (Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if _builds(a)]
        if members:
            # typing.Union, not `|`: members may be forward-reference strings or special forms `|` rejects
            return functools.reduce(lambda a, b: Union[a, b], members)  # noqa: UP007
    return Any


def _builds(annotation: Any) -> bool:
    try:
        TypeAdapter(annotation, config=ConfigDict(arbitrary_types_allowed=True))
    except Exception:  # pydantic's schema errors take several types; any of them means "not checkable"
        return False
    return True


def check_arguments(
    functions: tuple[Callable, ...], values: dict[str, Any], exclude: frozenset[str], what: str
) -> dict[str, Any]:
    """Check keyword arguments against :func:`keyword_model`; return them as given.

    Args:
        functions: Whose parameters are accepted.
        values: The arguments (from a file).
        exclude: Parameter names the file may not set.
        what: Names the arguments in errors (``"MIPROv2 setting(s)"``).

    Raises:
        ValueError: one line: unknown names (the accepted ones listed), or the first ill-typed value.
    """
    model = keyword_model(functions, exclude)
    unknown = sorted(set(values) - set(model.model_fields))
    if unknown:
        raise ValueError(
            f"unknown {what} {', '.join(unknown)}; allowed: {', '.join(sorted(model.model_fields)) or '(none)'}"
        )
    try:
        model.model_validate(values)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        raise ValueError(problem_line(first, None, tuple(first["loc"]))) from None
    return values
