"""Transitional: the comparison moved to :mod:`hcqr_dspy.reporting` and its MLflow record to
:mod:`hcqr_dspy.tracking_comparison`.

This module only keeps the names ``hcqr_dspy.cli`` and ``hcqr_dspy.experiment`` still import from it; import
them from their new homes instead. It goes once those imports have moved.
"""

from hcqr_dspy.reporting import compare, metrics_table
from hcqr_dspy.tracking_comparison import track_comparison

__all__ = ["compare", "metrics_table", "track_comparison"]
