"""The method registry: every method's ``dspy.Module`` by its registered name, and building one by name.

A method registers itself where it is written, as retrievers do (:mod:`hcqr_dspy.retrieval.retriever_registry`)::

    @register_method("simple_rag")
    class SimpleRAG(MCQProgram): ...

    HCQRNoSupport = register_method("hcqr_no_support")(variant(HCQR, "HCQRNoSupport", "...", roles=(...)))

The decorator sets the class's ``method`` to the name. Importing :mod:`hcqr_dspy.programs` imports every module
of the package, so a method module placed there is registered whenever the package is used, with no list to
extend; a method written elsewhere (a plugin, a test) is registered once its module is imported, before the
registry is asked for it. :data:`PROGRAMS` maps each registered name to its class, in name order (A to Z), and
is read when asked: names registered later appear in it. :func:`make_program`, :func:`check_options`,
:func:`check_option_values` and :func:`refuse_bound` (a class with ``uses_answer``) read it.

The command line lists the names without importing this package (DSPy takes seconds to import):
:mod:`hcqr_dspy.cli.method_names` reads the ``register_method("name")`` calls from this package's source files
(Python's ``ast``), and adds the names registered in the running process once this module is loaded. So every
built-in method is written as a ``register_method`` call with its name as a string literal;
``tests/programs/test_registry.py`` checks that those names are the registered ones, and that the methods
table of ``docs/usage.md`` names each of them. ``--method`` is checked when the command runs (the names listed
in the error), not by the parser.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from hcqr_dspy.config import check_arguments
from hcqr_dspy.errors import HCQRError
from hcqr_dspy.programs.program_base import MCQProgram

P = TypeVar("P", bound=type[MCQProgram])

# A method's name: in run folders' paths, MLflow run names and on the command line.
NAME = re.compile(r"[a-z][a-z0-9_]*")

_REGISTERED: dict[str, type[MCQProgram]] = {}


def register_method(name: str) -> Callable[[P], P]:
    """Class decorator: register a :class:`~hcqr_dspy.programs.program_base.MCQProgram` subclass as method ``name``.

    Its ``method`` attribute is set to ``name`` (recorded in ``settings()``, run folders and saved programs);
    :data:`PROGRAMS` and every command then know it. Registering the same class again (a module reloaded) is
    allowed.

    Args:
        name: Lower-case letters, digits and ``_``, starting with a letter (``"simple_rag"``).

    Raises:
        ValueError: ``name`` is not such a name, is taken by another class, or the class is registered under
            another name already.
        TypeError: what is decorated is not a subclass of ``MCQProgram``.
    """
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ValueError(f"a method name is lower-case letters, digits and _ (starting with a letter), got {name!r}")

    def decorate(cls: P) -> P:
        if not (isinstance(cls, type) and issubclass(cls, MCQProgram)):
            raise TypeError(f"register_method({name!r}) decorates a subclass of MCQProgram, not {cls!r}")
        known = _REGISTERED.get(name)
        if known is not None and _where(known) != _where(cls):
            raise ValueError(f"method {name!r} is already registered by {_where(known)}")
        own = vars(cls).get("method")
        if own is not None and own != name and _REGISTERED.get(own) is cls:
            raise ValueError(f"{_where(cls)} is already registered as method {own!r}")
        cls.method = name
        _REGISTERED[name] = cls
        return cls

    return decorate


def _where(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


class _Registered(Mapping[str, type[MCQProgram]]):
    """The registered methods, read when asked, in name order (A to Z)."""

    def __getitem__(self, name: str) -> type[MCQProgram]:
        return _REGISTERED[name]

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(_REGISTERED))

    def __len__(self) -> int:
        return len(_REGISTERED)

    def __repr__(self) -> str:
        return f"PROGRAMS({', '.join(self)})"


PROGRAMS: Mapping[str, type[MCQProgram]] = _Registered()


def check_options(method: str, options: dict[str, Any]) -> dict[str, Any]:
    """Check constructor options of a registered method given in a file (an experiment, ``meta.json``).

    Names and annotated types are checked against the constructors of the method's class and its
    bases (:func:`hcqr_dspy.config.check_arguments`); options a variant fixes are not accepted.
    Value ranges (``pool_k >= budget`` ...) are the constructors': :func:`check_option_values` asks them.

    Returns:
        ``options``, as given.

    Raises:
        ValueError: an unknown method or option (the accepted ones listed), or an ill-typed value.
    """
    if method not in PROGRAMS:
        raise ValueError(f"unknown method {method!r}; allowed: {', '.join(PROGRAMS)}")
    cls = PROGRAMS[method]
    constructors = tuple(
        c.__init__
        for c in cls.__mro__
        if issubclass(c, MCQProgram) and "__init__" in vars(c) and "fixed_options" not in vars(c)
    )
    fixed = frozenset(getattr(cls, "fixed_options", {}))
    return check_arguments(constructors, options, frozenset({"self", "retriever"}) | fixed, f"{method} option(s)")


def refuse_bound(method: str, command: str) -> None:
    """Refuse a bound (a registered class with ``uses_answer``: it reads the gold answer,
    :mod:`hcqr_dspy.programs.bounds`) where no gold answer may be used: ``hcqr predict``, ``hcqr ask``, serving,
    ``hcqr compile``.

    Raises:
        HCQRError: ``method`` uses the gold answer.
    """
    if method in PROGRAMS and PROGRAMS[method].uses_answer:
        raise HCQRError(
            f"{method} retrieves with the gold answer: it is an upper bound for `hcqr eval` and comparisons, "
            f"not a method `{command}` can run"
        )


def check_option_values(method: str, options: dict[str, Any], budget: int | None = None) -> None:
    """Check the values of a method's options as its constructor does (ranges, choices, ``pool_k >=
    budget`` ...) without a retriever or an LM: the program is built over a placeholder retriever and
    dropped. A ``cross_encoder`` name is not loaded here (that happens when the run builds the program).

    Args:
        method: A registered method (names and types already checked by :func:`check_options`).
        options: Its constructor options.
        budget: The budget the run will use (``None``: the option's own or the default).

    Raises:
        ValueError: the constructor's one-line message (``k_per_query must be >= 1, got 0``).
    """
    values = {k: v for k, v in options.items() if not (k == "cross_encoder" and isinstance(v, str))}
    if budget is not None and "budget" not in values:
        values["budget"] = budget
    make_program(method, object(), **values)


def make_program(method: str, retriever=None, **options) -> MCQProgram:
    """Instantiate a registered method.

    Raises:
        HCQRError: unknown method (the valid names are listed).
    """
    if method not in PROGRAMS:
        raise HCQRError(f"unknown method {method!r}; choose one of {', '.join(PROGRAMS)}")
    return PROGRAMS[method](retriever=retriever, **options)
