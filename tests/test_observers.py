"""The seam between running programs and recording them (hcqr_dspy/observers.py): the evaluation loop tells the
observer it is given of each question, and the program's stages, searches and fusions reach that observer while the
question runs; MLflow is never imported on the way."""

import json
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

# Runs in a fresh interpreter, so that sys.modules shows what the loop, the program and the observer imported.
PROBE = r"""
import json, sys
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, sys.argv[1])
import dspy
from dspy.utils import DummyLM
from helpers import TINY_ROWS

from hcqr_dspy.data import check_question
from hcqr_dspy.evaluation.answering import evaluate
from hcqr_dspy.evaluation.run_folder import RunFolder
from hcqr_dspy.observers import NO_OBSERVER, installed
from hcqr_dspy.programs import HCQR
from hcqr_dspy.retrieval import BM25Retriever, Corpus, Passage

EVENTS = []


class Record:
    def __init__(self, qid):
        self.trace_id = f"toy-{qid}"

    def output(self, value):
        EVENTS.append(["question output", value])

    def finish(self, row):
        EVENTS.append(["question finish", row["qid"], row["prediction"]])
        row["trace_id"] = self.trace_id


class StageRecord:
    def __init__(self, name):
        self.name = name

    def output(self, value):
        EVENTS.append(["stage output", self.name, sorted(value)])


class Toy:
    # a whole Observer written here, not derived from anything of hcqr_dspy's
    @contextmanager
    def question(self, name, question, options, tags):
        EVENTS.append(["question start", name, tags["qid"], question])
        yield Record(tags["qid"])
        EVENTS.append(["question end", tags["qid"]])

    @contextmanager
    def stage(self, name, inputs=None):
        EVENTS.append(["stage enter", name])
        yield StageRecord(name)
        EVENTS.append(["stage exit", name])

    def retrieved(self, retriever, queries, hit_lists, names, k, start_ns, end_ns):
        EVENTS.append(["retrieved", list(names), k, [0 < len(h) <= k for h in hit_lists], start_ns <= end_ns])

    def fused(self, retriever, fused, names, strategy, budget, start_ns, end_ns):
        EVENTS.append(["fused", list(names), strategy, budget, 0 < len(fused) <= budget])


options = {"A": "Digoxin toxicity", "B": "Graves disease", "C": "Iron deficiency anemia"}
record = {"options": options, "answer": "A"}
texts = [f"Question {i}: nausea and yellow vision?" for i in range(2)]
questions = [check_question(f"q{i}", {**record, "question": text}, "t") for i, text in enumerate(texts)]
lm = DummyLM(
    {
        "`support_query`": {"support_query": "digoxin", "distinction_query": "graves", "key_feature_query": "nausea"},
        "`discriminating_features`": {
            "discriminating_features": "yellow vision",
            "reasoning": "glycoside",
            "working_hypothesis": "A",
            "confirming_evidence": "hypokalemia",
        },
        "`answer`": {"reasoning": "Glycoside excess.", "answer": "A"},
    },
    adapter=dspy.JSONAdapter(),
)
retriever = BM25Retriever(Corpus([Passage(*r) for r in TINY_ROWS], source="tiny"), show_progress=False)
folder = RunFolder.create(Path(sys.argv[2]), {"method": "hcqr", "dataset": "t.json"})
with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
    program = HCQR(retriever, budget=4, k_per_query=2)
    result = evaluate(program, questions, folder, "hcqr", progress=False, observer=Toy())
print(json.dumps({
    "events": EVENTS,
    "rows": [[r["qid"], r["prediction"], r.get("trace_id")] for r in folder.rows()],
    "ran": result.ran,
    "installed_after": installed() is NO_OBSERVER,
    "mlflow": sorted(m for m in sys.modules if m == "mlflow" or m.startswith("mlflow.")),
}))
"""


def test_the_evaluation_loop_tells_its_observer_each_question_and_stage_without_importing_mlflow(tmp_path):
    env = {**os.environ, "DSPY_CACHEDIR": str(tmp_path / "dspy-cache")}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(TESTS), str(tmp_path / "run")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["mlflow"] == []  # neither the loop, the program nor the observer seam imported MLflow
    assert out["ran"] == 2
    # finish() saw each row before it was written: the id it added is in predictions.jsonl
    assert out["rows"] == [["q0", "A", "toy-q0"], ["q1", "A", "toy-q1"]]
    assert out["installed_after"]  # installed only while the questions ran
    events = out["events"]
    first = events[: events.index(["question end", "q0"]) + 1]
    names = ["q1 (support)", "q2 (distinction)", "q3 (key features)"]
    assert first == [
        ["question start", "hcqr", "q0", "Question 0: nausea and yellow vision?"],
        ["stage enter", "hypothesis"],
        [
            "stage output",
            "hypothesis",
            ["confirming_evidence", "discriminating_features", "reasoning", "working_hypothesis"],
        ],
        ["stage exit", "hypothesis"],
        ["stage enter", "rewrite"],
        ["stage output", "rewrite", ["raw_queries"]],
        ["stage exit", "rewrite"],
        ["stage enter", "retrieval"],
        ["retrieved", names, 2, [True, True, True], True],
        ["fused", names, "score_sum", 4, True],
        ["stage exit", "retrieval"],
        ["stage enter", "answer"],
        ["stage output", "answer", ["answer", "error", "reasoning", "valid"]],
        ["stage exit", "answer"],
        ["question finish", "q0", "A"],
        ["question end", "q0"],
    ]
    assert events[len(first)][:3] == ["question start", "hcqr", "q1"] and events[-1] == ["question end", "q1"]
