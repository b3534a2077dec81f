"""A method that is another one with some constructor options fixed, without copying its code.

HCQR's ablations (``hcqr_no_support`` ...) and ``query_rewrite_options`` are such variants (:func:`variant`),
each registered under its own name (:func:`~hcqr_dspy.programs.method_registry.register_method`).
"""

from __future__ import annotations

import inspect
import types
from typing import Any, TypeVar

from hcqr_dspy.programs.program_base import MCQProgram

P = TypeVar("P", bound=MCQProgram)


def variant(base: type[P], name: str, doc: str, **fixed: Any) -> type[P]:
    """A subclass of ``base`` with some constructor options fixed, to register under a name of its own.

    Ablations and controls are options of one class, not copies of it; registered
    (``register_method("hcqr_no_support")(variant(...))``), such a configuration has its own method name
    (recorded as ``method`` in ``settings()`` and the run records). The class is placed in ``base``'s
    module: assign it there to a module-level ``name`` so it pickles.

    Args:
        base: The program class.
        name: Class name of the variant (``"HCQRNoSupport"``).
        doc: Its docstring.
        **fixed: The options it fixes; passing one of them with another
            value raises ``ValueError`` (passing the same value is allowed).

    Examples:
        >>> HCQRNoSupport = register_method("hcqr_no_support")(
        ...     variant(HCQR, "HCQRNoSupport", "...", roles=("distinction", "key_features"))
        ... )
        >>> HCQRNoSupport(retriever).settings()["roles"]
        ['distinction', 'key_features']
    """

    def __init__(self, retriever=None, **options: Any) -> None:
        for key, value in fixed.items():
            if key in options and _as_tuple(options[key]) != _as_tuple(value):
                method = type(self).method
                raise ValueError(f"method {method!r} fixes {key}={value!r}; use {base.method!r} to choose {key}")
            options[key] = value
        base.__init__(self, retriever, **options)

    # Introspection (e.g. checking an experiment's method_options) sees base's options minus the fixed ones.
    sig = inspect.signature(base.__init__)
    __init__.__signature__ = sig.replace(parameters=[p for p in sig.parameters.values() if p.name not in fixed])

    def body(ns: dict[str, Any]) -> None:
        ns.update(__init__=__init__, __doc__=doc, __module__=base.__module__, fixed_options=dict(fixed))

    return types.new_class(name, (base,), exec_body=body)


def _as_tuple(value: Any) -> Any:
    """Lists and tuples compare equal by content (settings() records tuples as lists)."""
    return tuple(value) if isinstance(value, (list, tuple)) else value
