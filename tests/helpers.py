"""Helpers shared by tests: tiny corpora and JSONL writers."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

TINY_ROWS = [
    (
        "p1",
        "Iron deficiency anemia",
        "Microcytic hypochromic anemia with low ferritin and high total iron-binding capacity.",
    ),
    (
        "p2",
        "Vitamin B12 deficiency",
        "Macrocytic anemia with hypersegmented neutrophils and subacute combined degeneration of the cord.",
    ),
    (
        "p3",
        "Digoxin toxicity",
        "Nausea, yellow-green vision and atrial tachycardia with block; worsened by hypokalemia.",
    ),
    (
        "p4",
        "Graves disease",
        "Hyperthyroidism with diffuse goiter, exophthalmos and pretibial myxedema from TSH receptor antibodies.",
    ),
    (
        "p5",
        "Hashimoto thyroiditis",
        "Hypothyroidism with anti-thyroid peroxidase antibodies and lymphocytic infiltrate with germinal centers.",
    ),
    (
        "p6",
        "Streptococcus pneumoniae",
        "Lancet-shaped gram-positive diplococci; the most common cause of community-acquired pneumonia.",
    ),
    (
        "p7",
        "Myasthenia gravis",
        "Fatigable ptosis and diplopia from antibodies against the acetylcholine receptor; improves with edrophonium.",
    ),
    (
        "p8",
        "Lambert-Eaton syndrome",
        "Proximal weakness improving with repeated use; antibodies to presynaptic calcium channels; "
        "small cell carcinoma.",
    ),
]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    return path


def comparison_row(qid: str, method: str, correct: bool, **extra) -> dict:
    """A finished ``predictions.jsonl`` row as `hcqr compare` reads it: gold ``A``, answered ``A`` when
    ``correct`` else ``B``, three LM calls of 100 + 10 tokens in 1 s; ``extra`` adds or replaces fields."""
    row = {
        "qid": qid,
        "method": method,
        "prediction": "A" if correct else "B",
        "gold": "A",
        "valid": True,
        "correct": correct,
        "stages": {},
        "lm_calls": 3,
        "prompt_tokens": 100,
        "completion_tokens": 10,
        "seconds": 1.0,
    }
    return {**row, **extra}


def snippet(pid: str, title: str, content: str) -> dict:
    return {"id": pid, "title": title, "content": content, "contents": f"{title}. {content}"}


class SchemaEngine:
    """A deterministic DSPy engine for optimizer tests: it fills any JSON schema DSPy asks for.

    Enum fields get ``answer`` when it is allowed (else their first value), strings a fixed
    query-like text, numbers 1; a request without a schema (a free-text prompt) gets an
    instruction in a fenced block. Every prompt is recorded in ``prompts``.
    """

    supports_response_schema = True
    supported_params = frozenset({"response_format", "temperature", "max_tokens", "top_p", "top_k", "stop", "seed"})
    free_text = "```\nRead the question, weigh the findings that separate the options, then answer.\n```"

    def __init__(self, answer="A", text="digoxin toxicity yellow vision hypokalemia"):
        self.answer, self.text, self.prompts = answer, text, []

    def _value(self, prop):
        prop = prop or {}
        if "anyOf" in prop:
            prop = next((p for p in prop["anyOf"] if p.get("type") != "null"), prop["anyOf"][0])
        if "enum" in prop:
            return self.answer if self.answer in prop["enum"] else prop["enum"][0]
        kind = prop.get("type")
        if kind == "integer" or kind == "number":
            return 1
        if kind == "boolean":
            return True
        if kind == "array":
            return [self._value(prop.get("items"))]
        if kind == "object":
            return {k: self._value(v) for k, v in (prop.get("properties") or {}).items()}
        return self.text

    def fill(self, request, properties: dict) -> dict:
        """The JSON reply to a request whose response schema has these properties."""
        return {k: self._value(v) for k, v in properties.items()}

    def complete(self, request):
        import json as _json

        from dspy.lm15 import Message, Response, TextPart, Usage

        prompt = "\n".join(m.text or "" for m in request.messages)
        self.prompts.append(prompt)
        rf = request.config.response_format or {}
        schema = rf.get("schema") if isinstance(rf, dict) else None
        text = _json.dumps(self.fill(request, schema.get("properties") or {})) if schema else self.free_text
        return Response(
            id=None,
            model="schema",
            message=Message.assistant([TextPart(text)]),
            finish_reason="stop",
            usage=Usage(input_tokens=len(prompt) // 4, output_tokens=len(text) // 4, total_tokens=0),
        )

    def stream(self, request):
        raise NotImplementedError

    def close(self):
        pass


def schema_lm(answer="A", engine=None, **kwargs):
    """A ``dspy.LM`` over ``engine`` (default: a :class:`SchemaEngine` answering ``answer``), with no cache,
    so every call reaches the engine; the engine is ``lm.schema_engine``."""
    import uuid

    import dspy

    engine = engine or SchemaEngine(answer, **kwargs)
    lm = dspy.LM(f"schema/{uuid.uuid4().hex}", engine=engine, temperature=0.0, max_tokens=200, cache=False)
    lm.schema_engine = engine
    return lm


class GoldEngine(SchemaEngine):
    """A :class:`SchemaEngine` whose answer step gives the gold letter of the live question when ``right(qid)``,
    else ``wrong`` (found by the question's text in the last message; ``gold``: ``{qid: (question, letter)}``)."""

    def __init__(self, gold: dict[str, tuple[str, str]], right=lambda qid: True, wrong="A"):
        super().__init__(answer=wrong)
        self.gold, self.right, self.wrong = gold, right, wrong

    def fill(self, request, properties: dict) -> dict:
        reply = super().fill(request, properties)
        if "answer" in properties:
            live = request.messages[-1].text or ""
            found = [(qid, letter) for qid, (text, letter) in self.gold.items() if text[:80] in live]
            reply["answer"] = found[0][1] if found and self.right(found[0][0]) else self.wrong
        return reply


def demo_gold() -> dict[str, tuple[str, str]]:
    """``{qid: (question, gold letter)}`` of the shipped demo questions (data/demo/questions.json)."""
    rows = json.loads((Path(__file__).resolve().parents[1] / "data" / "demo" / "questions.json").read_text())
    return {qid: (row["question"], row["answer"]) for qid, row in rows.items()}


# -- a teachable LM for optimizer tests ---------------------------------------------------------------
# Each question of the optimizer tests names one finding; the finding decides the correct option.
# (The hardest first: a train set's first question is one the zero-shot program gets wrong.)
FINDINGS = {"fatigable ptosis": "C", "yellow halos": "A", "exophthalmos": "B"}
TEACHING_OPTIONS = {"A": "Digoxin toxicity", "B": "Graves disease", "C": "Myasthenia gravis"}
# The instruction the teachable LM proposes when an optimizer asks it for one, and that it then follows.
TAUGHT = "Match the named finding to its disease; fatigable ptosis means myasthenia gravis."


def teaching_questions(prefix: str, n: int) -> dict[str, dict]:
    """``n`` MIRAGE rows cycling through :data:`FINDINGS` (so a third of them per finding)."""
    findings = list(FINDINGS)
    rows = {}
    for i in range(n):
        finding = findings[i % len(findings)]
        rows[f"{i:04d}"] = {
            "question": f"{prefix} case {i}: the patient presents with {finding}. Diagnosis?",
            "options": TEACHING_OPTIONS,
            "answer": FINDINGS[finding],
        }
    return rows


class TeachableEngine(SchemaEngine):
    """A deterministic LM whose answers depend on its prompt, so that what an optimizer adds can be seen to work.

    On the answer step (a schema with an ``answer`` field) it answers, for the finding named in the live question:

    * ``yellow halos``: ``A`` (right) always;
    * ``exophthalmos``: ``B`` (right) only when the prompt holds a worked example (a few-shot demo: an
      assistant turn before the live question), else ``A``;
    * ``fatigable ptosis``: ``C`` (right) only when the system prompt (the predictor's instructions) contains
      :data:`TAUGHT`, else ``A``.

    Zero-shot it is therefore right on a third of the questions; demos add a third, the taught instruction
    another. Asked for an instruction (a schema field named ``*instruction*``, MIPROv2's proposer, or a
    free-text prompt, GEPA's reflection), it proposes :data:`TAUGHT`. Every other field is filled as by
    :class:`SchemaEngine`. ``answers`` records ``(finding, had_demos, taught, letter)`` per answer step.
    """

    def __init__(self):
        super().__init__(answer="A")
        self.answers: list[tuple[str | None, bool, bool, str]] = []

    def _answer(self, request) -> str:
        live = (request.messages[-1].text or "").split("[[ ## question ## ]]")[-1].split("[[ ##")[0]  # not the context
        finding = next((f for f in FINDINGS if f in live), None)
        had_demos = any(m.role == "assistant" for m in request.messages[:-1])
        system = (
            request.system
            if isinstance(request.system, str)
            else " ".join(getattr(p, "text", "") or "" for p in (request.system or ()))
        )
        taught = TAUGHT in system
        letter = "A"
        if finding == "exophthalmos" and had_demos or finding == "fatigable ptosis" and taught:
            letter = FINDINGS[finding]
        self.answers.append((finding, had_demos, taught, letter))
        return letter

    free_text = f"```\n{TAUGHT}\n```"

    def fill(self, request, properties: dict) -> dict:
        reply = {k: TAUGHT if "instruction" in k else self._value(v) for k, v in properties.items()}
        if "answer" in properties:
            reply["answer"] = self._answer(request)
        return reply


def teachable_lm():
    """A ``dspy.LM`` over a fresh :class:`TeachableEngine` (no cache)."""
    return schema_lm(engine=TeachableEngine())


# -- real servers started by tests (MLflow UI, MLflow scoring server): ports and process trees ------------
def fill(disk: Path) -> Path:
    """Write ``disk/filler`` until the disk is full."""
    filler = disk / "filler"
    with filler.open("wb") as fh:
        try:
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        except OSError:
            pass
    return filler


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from /proc)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def alive(pid: int) -> bool:
    """Running or sleeping; a zombie (exited, not yet reaped by its new parent) counts as stopped."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_until_serving(url: str, proc: subprocess.Popen, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read()[-3000:] if proc.stderr else ""
            raise AssertionError(f"the server exited early with {proc.returncode}: {err}")
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise AssertionError(f"{url} did not answer within {timeout:.0f} s")


def start_scoring_server(serve_args: list[str], tracking_uri: str, extra_env: dict | None = None):
    """Start ``mlflow <serve_args>`` (``models serve -m ... -p PORT ...``) in its own process group, in this
    interpreter's environment with the repository importable, and wait until it answers ``/ping``.

    Returns:
        ``(process, invocations URL)``.
    """
    import os
    import sys

    port = serve_args[serve_args.index("-p") + 1]
    # MLflow's scoring server runs `uvicorn` from PATH: the virtualenv's bin folder, as when it is activated
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": tracking_uri,
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH")])
        ),
        **(extra_env or {}),
    }
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", *serve_args],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_until_serving(f"http://127.0.0.1:{port}/ping", server)
    return server, f"http://127.0.0.1:{port}/invocations"


def stop_process_group(proc: subprocess.Popen) -> None:
    """SIGTERM ``proc``'s process group, SIGKILL it after 30 s, and reap ``proc``."""
    import os
    import signal

    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def load_bench_module(name: str):
    """``bench/<name>.py`` imported as a module (the benchmark scripts are not a package)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_session(folder) -> None:
    """A run folder's ``sessions.jsonl`` with one ``hcqr eval`` session of this machine (no in-process engine)
    that wrote every row: the record a run made today holds, so a comparison can check its setup."""
    from hcqr_dspy.evaluation.provenance import session_record

    record = {"session": 1, **session_record("eval"), "predictions_before": 0, "judgments_before": 0}
    (Path(folder) / "sessions.jsonl").write_text(json.dumps(record) + "\n")


def compile_spec(index, out, **kw):
    """A ``CompileSpec`` of HCQR with the shipped bootstrap_fewshot recipe on 6 demo questions (budget 3, one
    passage a query) over ``index``, into ``out``; ``kw`` replaces any field."""
    from hcqr_dspy.workflows.compile_inputs import CompileSpec

    repo = Path(__file__).resolve().parents[1]
    base = dict(
        recipe=str(repo / "optimizers" / "bootstrap_fewshot.yaml"),
        method="hcqr",
        train=str(repo / "data" / "demo" / "questions.json"),
        index=str(index),
        out=str(out),
        lm="openai/unused",
        train_size=6,
        val_size=0,
        program_options={"budget": 3, "k_per_query": 1},
    )
    return CompileSpec(**{**base, **kw})
