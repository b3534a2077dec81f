"""Compatibility module: models logged by earlier versions import it.

A pyfunc model logged from code carries a copy of the model's code file, and in models logged by earlier versions
that copy does ``from hcqr_dspy.serving import python_model``; this module keeps those models loading. New code
imports :mod:`hcqr_dspy.tracking.serving`.
"""

from hcqr_dspy.tracking.serving import python_model

__all__ = ["python_model"]
