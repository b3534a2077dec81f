"""The ``hcqr`` command line: one module per command group (:mod:`~hcqr_dspy.cli.index`,
:mod:`~hcqr_dspy.cli.evaluate`, :mod:`~hcqr_dspy.cli.ask`, :mod:`~hcqr_dspy.cli.demo`,
:mod:`~hcqr_dspy.cli.judge`, :mod:`~hcqr_dspy.cli.compare`, :mod:`~hcqr_dspy.cli.experiment`,
:mod:`~hcqr_dspy.cli.compile`, :mod:`~hcqr_dspy.cli.ui`), each parsing its flags, calling one workflow and
printing; :mod:`~hcqr_dspy.cli.common` holds what they share and :mod:`~hcqr_dspy.cli.main` assembles the
parser. :func:`main` is the console entry point (``hcqr = "hcqr_dspy.cli:main"``); ``python -m hcqr_dspy.cli``
runs it too.
"""

from hcqr_dspy.cli.main import main

__all__ = ["main"]
