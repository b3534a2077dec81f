"""Programs: one ``dspy.Module`` per method, each registered by name where it is written
(``@register_method("name")``, :mod:`hcqr_dspy.programs.method_registry`).

Importing this package imports every module in it, so a method module placed here is registered whenever
the package is used; the methods and what each retrieves with are listed in ``docs/usage.md`` ("Methods").
HCQR's ablations are options of :class:`HCQR` (``roles``, ``show_hypothesis``) registered with those options
fixed (:func:`~hcqr_dspy.programs.variants.variant`).

The shared base is :mod:`hcqr_dspy.programs.program_base`, the LM signatures :mod:`hcqr_dspy.programs.signatures`.
This package re-exports the public names users import (``from hcqr_dspy.programs import HCQR, make_program,
PROGRAMS``).
"""

import importlib
import pkgutil

from hcqr_dspy.programs.cot import CoT
from hcqr_dspy.programs.hcqr import (
    HCQR,
    HCQRNoDistinction,
    HCQRNoKeyFeatures,
    HCQRNoSupport,
    HCQRShowHypothesis,
    WorkingHypothesis,
)
from hcqr_dspy.programs.hyde import HyDE
from hcqr_dspy.programs.main_rag import MainRAG
from hcqr_dspy.programs.method_registry import (
    PROGRAMS,
    check_option_values,
    check_options,
    make_program,
    refuse_bound,
    register_method,
)
from hcqr_dspy.programs.program_base import MCQProgram, accepted_options
from hcqr_dspy.programs.query_rewrite import QueryRewrite, QueryRewriteOptions
from hcqr_dspy.programs.rerank_rag import RerankRAG
from hcqr_dspy.programs.simple_rag import SimpleRAG

# Every other module of the package too: a method module registers its methods when imported.
for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
del _module

__all__ = [
    "CoT",
    "HCQR",
    "HCQRNoDistinction",
    "HCQRNoKeyFeatures",
    "HCQRNoSupport",
    "HCQRShowHypothesis",
    "HyDE",
    "MainRAG",
    "MCQProgram",
    "PROGRAMS",
    "accepted_options",
    "check_options",
    "check_option_values",
    "QueryRewrite",
    "QueryRewriteOptions",
    "RerankRAG",
    "SimpleRAG",
    "WorkingHypothesis",
    "make_program",
    "refuse_bound",
    "register_method",
]
