"""``hcqr split``: split a question file into seeded, non-overlapping train / validation / test files.

Its command imports the workflow it calls when it runs, so that ``hcqr --help`` loads no DSPy.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from hcqr_dspy.cli.common import non_negative_int


def cmd_split(args: argparse.Namespace) -> int:
    from hcqr_dspy.workflows.split import PARTS, RECORD, split_questions

    record = split_questions(args.questions, args.fractions, seed=args.seed, out=args.out, replace=args.replace)
    out = Path(args.out)
    source = record["source"]
    print(f"split {source['file']} ({source['questions']} questions, seed {args.seed}) into {out}:")
    uses = {"train": "hcqr compile --train", "val": "choosing between programs", "test": "hcqr eval --dataset"}
    for part in PARTS:
        info = record["parts"][part]
        print(f"  {out / info['file']}: {info['questions']} questions (for {uses[part]})")
    print(f"  {out / RECORD}: the source file's SHA-256, the seed, the fractions and each part's ids")
    return 0


def add_parsers(command: Callable[..., argparse.ArgumentParser]) -> None:
    """Add ``split`` (``command(name, **kwargs)`` adds one subcommand's parser)."""
    p = command(
        "split",
        help="split a question file into seeded, non-overlapping train / validation / test files",
    )
    p.add_argument("questions", help="MIRAGE-format question file (.json, or .jsonl), e.g. data/demo/questions.json")
    p.add_argument(
        "--fractions",
        default="0.5,0.2,0.3",
        metavar="TRAIN,VAL,TEST",
        help="shares of the questions in train, validation and test, summing to 1; each part gets at least one "
        "question (default: 0.5,0.2,0.3)",
    )
    p.add_argument("--seed", type=non_negative_int, default=0, help="seed of the draw (default: 0)")
    p.add_argument(
        "--out",
        required=True,
        help="folder for train.json, val.json, test.json and split.json (the record of the draw), e.g. splits/demo",
    )
    p.add_argument(
        "--replace",
        action="store_true",
        help="write over the split files --out holds (refused without it)",
    )
    p.set_defaults(func=cmd_split)
