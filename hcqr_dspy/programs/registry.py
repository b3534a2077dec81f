"""The method registry: every method's ``dspy.Module`` by its registered name, and building one by name.

:data:`PROGRAMS` maps a method name to its class; :func:`make_program` builds one; :func:`check_options`
and :func:`check_option_values` check constructor options given in a file (an experiment, ``meta.json``)
before anything is built for real.
"""

from __future__ import annotations

from typing import Any

import hcqr_dspy.programs.hcqr as hcqr_family
from hcqr_dspy.config import check_arguments
from hcqr_dspy.errors import HCQRError
from hcqr_dspy.programs.base import MCQProgram
from hcqr_dspy.programs.bounds import NoContext, OracleRAG
from hcqr_dspy.programs.cot import CoT
from hcqr_dspy.programs.hyde import HyDE
from hcqr_dspy.programs.main_rag import MainRAG
from hcqr_dspy.programs.query_rewrite import QueryRewrite, QueryRewriteOptions
from hcqr_dspy.programs.rerank_rag import RerankRAG
from hcqr_dspy.programs.simple_rag import SimpleRAG

PROGRAMS: dict[str, type[MCQProgram]] = {
    cls.method: cls
    for cls in (
        CoT,
        SimpleRAG,
        hcqr_family.HCQR,
        HyDE,
        QueryRewrite,
        QueryRewriteOptions,
        RerankRAG,
        MainRAG,
        hcqr_family.HCQRNoSupport,
        hcqr_family.HCQRNoDistinction,
        hcqr_family.HCQRNoKeyFeatures,
        hcqr_family.HCQRShowHypothesis,
        hcqr_family.WorkingHypothesis,
        OracleRAG,
        NoContext,
    )
}


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
    """Refuse a bound (a method that reads the gold answer, :mod:`hcqr_dspy.programs.bounds`) where no gold
    answer may be used: ``hcqr predict``, ``hcqr ask``, serving, ``hcqr compile``.

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
