"""Evaluation: running a program over questions and keeping what it did.

A run folder (:mod:`~hcqr_dspy.evaluation.run_folder`) holds one evaluation's records; its record files
(:mod:`~hcqr_dspy.evaluation.records`) are appended by the resumable parallel loop
(:mod:`~hcqr_dspy.evaluation.loop`) under one writer (:mod:`~hcqr_dspy.evaluation.lock`), which stops on an outage
(:mod:`~hcqr_dspy.evaluation.outages`) with what is saved. :mod:`~hcqr_dspy.evaluation.answering` runs a program
over questions into it, one row per question (:mod:`~hcqr_dspy.evaluation.rows`); the rows are summarised by
:mod:`~hcqr_dspy.evaluation.metrics` and :mod:`~hcqr_dspy.evaluation.evidence`; each session that wrote a folder is
described by :mod:`~hcqr_dspy.evaluation.provenance`; question sets are identified by
:mod:`~hcqr_dspy.evaluation.fingerprints` and runs over the same ones paired by
:mod:`~hcqr_dspy.evaluation.same_questions`.
"""
