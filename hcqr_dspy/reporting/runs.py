"""Run folders loaded for a comparison: :class:`Run`, their labels, restricting them to shared questions, and where
their rows and judgments were made (:func:`session_summary`, from ``sessions.jsonl``).

Every run is a run folder written by ``hcqr eval`` (``config.json``, ``predictions.jsonl``, ``metrics.json``,
and ``dur.json`` / ``judgments.jsonl`` once judged by ``hcqr judge``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hcqr_dspy.errors import HCQRError
from hcqr_dspy.evaluation.metrics import summarize
from hcqr_dspy.evaluation.option_probs import folder_rows_with_option_probs
from hcqr_dspy.evaluation.provenance import machine_key
from hcqr_dspy.evaluation.run_folder import DUR_METRICS, RunFolder
from hcqr_dspy.judge.dur_metrics import dur_metrics
from hcqr_dspy.reporting.saved_programs import ProgramFolder, ProgramFolders

# What every row of a run needs to be compared (written by :func:`hcqr_dspy.evaluation.rows.prediction_row`).
ROW_KEYS = ("prediction", "valid", "correct", "gold")
# The cost of a row that the report's cost columns average (``cached_lm_calls`` too where present: older rows lack it).
COST_KEYS = ("lm_calls", "prompt_tokens", "completion_tokens", "seconds")


@dataclass
class Run:
    """A run folder, loaded: its configuration, rows, metrics and DUR judgments, and the folder of the saved
    program it ran (``program``: :class:`~hcqr_dspy.reporting.saved_programs.ProgramFolder`, read when first asked;
    ``None`` for a run that recorded no program folder)."""

    folder: RunFolder
    label: str
    rows: list[dict[str, Any]]
    metrics: dict[str, Any]
    dur: dict[str, Any] = field(default_factory=dict)
    judgments: list[dict[str, Any]] = field(default_factory=list)
    program: ProgramFolder | None = None

    @property
    def path(self) -> Path:
        return self.folder.path

    @property
    def config(self) -> dict[str, Any]:
        return self.folder.config

    @property
    def correct(self) -> dict[str, bool]:
        return {r["qid"]: bool(r["correct"]) for r in self.rows}

    @property
    def hypothesis_correct(self) -> dict[str, bool] | None:
        """Per question, whether the working hypothesis was right (a hypothesis that could not be parsed
        counts wrong, as an invalid answer does); ``None`` for runs without hypotheses."""
        if not any(
            "hypothesis" in r and (r.get("hypothesis") or (r.get("fallbacks") or {}).get("hypothesis_failed"))
            for r in self.rows
        ):
            return None
        return {
            r["qid"]: bool(r.get("hypothesis")) and r["hypothesis"].get("working_hypothesis") == r["gold"]
            for r in self.rows
        }


def restrict(run: Run, qids: Sequence[str]) -> None:
    """Keep only ``qids`` of a run: its rows, judgments, and the metrics and DUR recomputed from them."""
    keep = set(qids)
    run.rows = [r for r in run.rows if r["qid"] in keep]
    run.metrics = summarize(run.rows)
    run.judgments = [j for j in run.judgments if j.get("qid") in keep]
    run.dur = dur_metrics(run.judgments) if run.judgments else {}  # judgments are the record DUR is computed from


def load_run(path: str | Path, label: str | None = None, programs: ProgramFolders | None = None) -> Run:
    """Load a run folder (through :class:`~hcqr_dspy.evaluation.run_folder.RunFolder`).

    Args:
        path: The run folder.
        label: Its label in the report (default :func:`run_label`).
        programs: Where the run's saved-program folder comes from: runs loaded with one ``programs`` share the
            :class:`~hcqr_dspy.reporting.saved_programs.ProgramFolder` of a folder (each read once); default a
            folder of the run's own.

    Raises:
        HCQRError: not a run folder, no finished question, unreadable records or judgments.
    """
    folder = RunFolder.open(path)
    if not folder.rows():  # before its other records are matched against the rows
        raise HCQRError(f"run {folder.path} has no finished question")
    rows = folder_rows_with_option_probs(folder)  # with the letter distributions `hcqr rescore` added
    for r in rows:
        check_row(folder.predictions.path, r)
    if any(r.get("gold") is None for r in rows):
        raise HCQRError(
            f"run {folder.path} answered questions without gold answers (`hcqr predict`); "
            "a comparison needs gold answers"
        )
    saved = folder.config.get("saved_program")
    if saved is not None and not (isinstance(saved, dict) and isinstance(saved.get("folder", ""), str)):
        raise HCQRError(f"run {folder.path}: config.json's saved_program is not a saved-program record: {saved!r:.80}")
    judgments = folder.judgments()
    # the judgments file is the record (a judge stopped midway has not rewritten dur.json yet)
    dur = dur_metrics(judgments) if judgments else folder.read_json(DUR_METRICS)
    program = (programs or ProgramFolders()).get(saved["folder"]) if saved and saved.get("folder") else None
    return Run(folder, label or run_label(folder.config, folder.path), rows, summarize(rows), dur, judgments, program)


def _amount(value: Any) -> bool:
    """A finite number of at least 0 that a float holds (a whole number past a float's range is none)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value)) and value >= 0
    except OverflowError:
        return False


def _letter(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 1 and "A" <= value <= "Z"


def check_row(path: Path, row: dict[str, Any]) -> None:
    """Refuse a row a comparison would misread: a missing :data:`ROW_KEYS` field, a gold or predicted answer that
    is not an option letter, ``correct`` that disagrees with ``prediction`` and ``gold``, ``queries`` that are
    not a list of strings, a missing or negative cost (:data:`COST_KEYS`), a per-stage cost or fallback count that
    is not a finite number of at least 0, or a ``cpu_pressure`` that is not a share from 0 to 1.

    Raises:
        HCQRError: naming ``path`` and the question.
    """
    where = f"{path}: the row of question {row['qid']!r}"
    missing = [k for k in ROW_KEYS if k not in row]
    if missing:
        raise HCQRError(f"{where} lacks {', '.join(missing)} (not written by `hcqr eval`); repair or delete that line")
    gold, prediction, valid = row["gold"], row["prediction"], row["valid"]
    if gold is not None and not _letter(gold):
        raise HCQRError(f"{where} has gold {gold!r}, not an option letter; repair or delete that line")
    if not isinstance(valid, bool) or (gold is not None and not isinstance(row["correct"], bool)):
        raise HCQRError(f"{where} has a `valid` or `correct` that is not true/false; repair or delete that line")
    if (valid or prediction is not None) and not _letter(prediction):
        raise HCQRError(f"{where} has prediction {prediction!r}, not an option letter; repair or delete that line")
    if gold is not None and row["correct"] != (valid and prediction == gold):
        raise HCQRError(
            f"{where} says correct={row['correct']} for prediction {prediction!r} and gold {gold!r}; "
            "repair or delete that line"
        )
    queries = row.get("queries")
    if queries is not None and not (isinstance(queries, list) and all(isinstance(q, str) for q in queries)):
        raise HCQRError(f"{where} has queries that are not a list of strings; repair or delete that line")
    # a missing cost would count as nothing in the cost columns, making a method look free
    bad = [f"{k} missing" for k in COST_KEYS if row.get(k) is None]
    present = [k for k in (*COST_KEYS, "cached_lm_calls") if row.get(k) is not None]
    bad += [f"{k}={row[k]!r:.40}" for k in present if not _amount(row[k])]
    bad += _bad_parts(row)
    if bad:
        raise HCQRError(
            f"{where} has no usable cost ({', '.join(bad)}; each a finite number of at least 0, as `hcqr eval` "
            "writes); repair or delete that line"
        )
    pressure = row.get("cpu_pressure")
    if pressure is not None and not (_amount(pressure) and pressure <= 1):
        raise HCQRError(
            f"{where} has cpu_pressure={pressure!r}, not a share from 0 to 1 (or null); repair or delete that line"
        )


def _bad_parts(row: dict[str, Any]) -> list[str]:
    """What is wrong with a row's per-stage costs (``stages``: ``{stage: {field: amount}}``) and fallback counts
    (``fallbacks``: ``{name: amount}``), which the run's metrics add up: each value null or an amount."""
    stages, fallbacks, bad = row.get("stages") or {}, row.get("fallbacks") or {}, []
    if not (isinstance(stages, dict) and all(isinstance(st, dict) for st in stages.values())):
        stages, bad = {}, ["stages is not a mapping of stages"]
    if not isinstance(fallbacks, dict):
        fallbacks, bad = {}, [*bad, "fallbacks is not a mapping of counts"]
    values = {f"stages.{name}.{f}": v for name, st in stages.items() for f, v in st.items()}
    values |= {f"fallbacks.{name}": v for name, v in fallbacks.items()}
    return bad + [f"{where}={v!r:.40}" for where, v in values.items() if v is not None and not _amount(v)]


def checked_questions(folder: RunFolder) -> set[str]:
    """The question ids of a run folder's rows, each row checked (:meth:`RunFolder.iter_rows`: a question recorded
    twice; :func:`check_row`).

    Raises:
        HCQRError: naming the file and the question.
    """
    done = set()
    for row in folder.iter_rows():
        check_row(folder.predictions.path, row)
        done.add(str(row["qid"]))
    return done


def check_same_gold(runs: Sequence[Run]) -> None:
    """Refuse runs that record different gold answers for one question (rows of another dataset or edited).

    Raises:
        HCQRError: naming the question and both runs.
    """
    seen: dict[str, tuple[str, Run]] = {}
    for run in runs:
        for r in run.rows:
            first = seen.setdefault(r["qid"], (r["gold"], run))
            if first[0] != r["gold"]:
                raise HCQRError(
                    f"question {r['qid']!r} has gold {first[0]!r} in {first[1].path} but {r['gold']!r} in "
                    f"{run.path}: the runs do not answer the same questions"
                )


def run_label(config: dict[str, Any], path: Path) -> str:
    """The method, and for a saved (compiled) program ``method+recipe`` (``hcqr+bootstrap_fewshot``); a fresh
    method that answered with a saved program's answer step ``method+answer:recipe``
    (``oracle_rag+answer:bootstrap_fewshot``)."""
    method = config.get("method", path.name)
    saved = config.get("saved_program")
    if saved:
        return f"{method}+{saved.get('recipe') or 'saved'}"
    answer = config.get("answer_step")
    if answer:
        return f"{method}+answer:{answer.get('recipe') or 'saved'}"
    return method


def unique_labels(runs: Sequence[Run]) -> None:
    """Make the runs' labels unique (reports and ``comparison.json`` are keyed by them): a label shared by
    several runs gets the LM spec, then the folder name, then a number."""
    for extra in (
        lambda i, r: (r.config.get("lm") or {}).get("spec") or r.path.name,
        lambda i, r: r.path.name,
        lambda i, r: str(i + 1),
    ):
        counts: dict[str, int] = {}
        for r in runs:
            counts[r.label] = counts.get(r.label, 0) + 1
        for i, r in enumerate(runs):
            if counts[r.label] > 1:
                r.label = f"{r.label} ({extra(i, r)})"


def judged_ids(run: Run) -> frozenset[str]:
    """The questions a run's DUR was judged on (its judgments)."""
    return frozenset(j["qid"] for j in run.judgments)


def session_summary(run: Run) -> dict[str, Any]:
    """Where a run's rows and judgments were made (``sessions.jsonl``): ``sessions`` (``hcqr eval`` sessions),
    ``machines`` (their :func:`hcqr_dspy.evaluation.provenance.machine_key`, oldest first), ``rows_before_sessions``
    (rows written before the first recorded eval session: all of them for a run without one) and
    ``judge_sessions`` / ``judge_machines`` likewise for ``hcqr judge``."""
    records = run.folder.sessions()
    evals = [s for s in records if s.get("command") == "eval"]
    judges = [s for s in records if s.get("command") == "judge"]
    return {
        "sessions": len(evals),
        "machines": list(dict.fromkeys(machine_key(s) for s in evals)),
        "rows_before_sessions": evals[0]["predictions_before"] if evals else len(run.folder.predictions.read()),
        "judge_sessions": len(judges),
        "judge_machines": list(dict.fromkeys(machine_key(s) for s in judges)),
    }


def provenance_line(summary: dict[str, Any]) -> str:
    """The Runs section's note on where a run's rows (and judgments) were made, from its :func:`session_summary`."""

    def where(machines: list[str]) -> str:
        return (
            f"on one machine: {machines[0]}"
            if len(machines) == 1
            else f"on {len(machines)} different machines or LM stacks: " + " | ".join(machines)
        )

    parts = []
    if summary["sessions"]:
        parts.append(f"rows written in {summary['sessions']} session(s) {where(summary['machines'])}")
    if summary["rows_before_sessions"]:
        parts.append(
            f"{summary['rows_before_sessions']} row(s) written before sessions were recorded (machine unknown)"
        )
    if summary["judge_sessions"]:
        parts.append(f"judged in {summary['judge_sessions']} session(s) {where(summary['judge_machines'])}")
    return "; ".join(parts)
