"""Programs: one ``dspy.Module`` per method, registered by name.

Methods: ``cot`` (no retrieval), ``simple_rag`` (the question, top 15),
``hcqr``, and the baselines ``hyde``, ``query_rewrite``,
``query_rewrite_options``, ``rerank_rag`` and ``main_rag``. HCQR's ablations are options of
:class:`HCQR` (``roles``, ``show_hypothesis``), registered with those options
fixed as ``hcqr_no_support``, ``hcqr_no_distinction``,
``hcqr_no_key_features`` and ``hcqr_show_hypothesis``; ``hcqr_hypothesis``
answers with HCQR's working hypothesis alone (no retrieval), to measure that step.

The registry is :mod:`hcqr_dspy.programs.registry`, the shared base :mod:`hcqr_dspy.programs.base`, the
LM signatures :mod:`hcqr_dspy.programs.signatures`. This package re-exports the public names users import
(``from hcqr_dspy.programs import HCQR, make_program, PROGRAMS``).
"""

from hcqr_dspy.programs.base import MCQProgram, accepted_options
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
from hcqr_dspy.programs.query_rewrite import QueryRewrite, QueryRewriteOptions
from hcqr_dspy.programs.registry import PROGRAMS, check_option_values, check_options, make_program, refuse_bound
from hcqr_dspy.programs.rerank_rag import RerankRAG
from hcqr_dspy.programs.simple_rag import SimpleRAG

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
]
