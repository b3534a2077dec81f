"""The ``hcqr`` command line: one module per command, ``<command>_command.py``
(:mod:`~hcqr_dspy.cli.index_command`, :mod:`~hcqr_dspy.cli.evaluate_command`, :mod:`~hcqr_dspy.cli.ask_command`,
:mod:`~hcqr_dspy.cli.demo_command`, :mod:`~hcqr_dspy.cli.judge_command`, :mod:`~hcqr_dspy.cli.compare_command`,
:mod:`~hcqr_dspy.cli.experiment_command`, :mod:`~hcqr_dspy.cli.compile_command`, :mod:`~hcqr_dspy.cli.ui_command`
and the others), each parsing its flags, calling one workflow and printing; :mod:`~hcqr_dspy.cli.common` holds
what they share and :mod:`~hcqr_dspy.cli.main` assembles the parser. :func:`main` is the console entry point
(``hcqr = "hcqr_dspy.cli:main"``); ``python -m hcqr_dspy.cli`` runs it too.
"""

from hcqr_dspy.cli.main import main

__all__ = ["main"]
