"""The DUR judge's labels, and which of them count as decision-useful.

``ENTAILED`` — the context alone implies the gold answer; ``USEFUL`` — strong support for the gold answer
that needs a small inference; ``NOT_USEFUL`` — otherwise (HCQR paper). A reply outside them is an invalid
judgment, never mapped to a label.
"""

from __future__ import annotations

# Best first: in passage mode the context's label is its best passage label.
LABELS = ("ENTAILED", "USEFUL", "NOT_USEFUL")
USEFUL_LABELS = {"ENTAILED", "USEFUL"}
# HCQR's queries, in order: support, distinction, key features (the role shares of dur_metrics).
ROLE_NAMES = ("q1", "q2", "q3")
