"""One ``dspy.Module`` per method, registered by name."""

from __future__ import annotations

from hcqr_dspy.errors import HCQRError
from hcqr_dspy.programs.base import MCQProgram
from hcqr_dspy.programs.cot import CoT
from hcqr_dspy.programs.hcqr import HCQR
from hcqr_dspy.programs.simple_rag import SimpleRAG

PROGRAMS: dict[str, type[MCQProgram]] = {"cot": CoT, "simple_rag": SimpleRAG, "hcqr": HCQR}


def make_program(method: str, retriever=None, **options) -> MCQProgram:
    """Instantiate a registered method.

    Raises:
        HCQRError: unknown method (the valid names are listed).
    """
    if method not in PROGRAMS:
        raise HCQRError(f"unknown method {method!r}; choose one of {', '.join(PROGRAMS)}")
    return PROGRAMS[method](retriever=retriever, **options)


__all__ = ["CoT", "HCQR", "MCQProgram", "PROGRAMS", "SimpleRAG", "make_program"]
