"""A run folder: every record of one evaluation, and the only code that reads or writes them.

Layout (one folder per evaluation)::

    config.json         the resolved configuration (method, program options, dataset and question fingerprints,
                        index, LM) and the folder's format (:mod:`.folder_format`); written once, inputs checked
    predictions.jsonl   one row per finished question, appended as it finishes (whole lines only)
    metrics.json        summary of the rows (:func:`hcqr_dspy.evaluation.metrics.summarize`)
    judgments.jsonl     DUR judge labels, one per judged question (``hcqr judge``)
    sessions.jsonl      one record per ``hcqr eval`` / ``hcqr judge`` session that wrote here: machine,
                        library versions, LM engine, and how many records existed before it
                        (:mod:`hcqr_dspy.evaluation.provenance`)
    dur.json            summary of the judgments (:func:`hcqr_dspy.judge.dur_metrics.dur_metrics`)
    option_probs.jsonl  the answer step's letter distribution per question, scored again for rows that lack
                        it (``hcqr rescore``; :mod:`hcqr_dspy.evaluation.option_probs`)
    tracebacks/<prefix>-<hash>.txt
                        the traceback of a question whose program raised an error that is not a
                        bad LM reply (the run stopped there; nothing was saved for that question),
                        named by a hash of its id, the whole id on the file's first line
                        (:mod:`~hcqr_dspy.evaluation.tracebacks`)
    .writer.lock        held while a process writes the folder (:class:`~hcqr_dspy.evaluation.lock.WriterLock`)

:class:`RunFolder` creates, reopens (resume) and reads these, and appends records; the evaluation, the
judge, the reports, tracking and the CLI go through it. Each ``.jsonl`` file is a
:class:`~hcqr_dspy.evaluation.records.JsonlTable` (append-only, resumable: rows are keyed by ``qid``, a
partial last line left by a killed writer is dropped and its item redone), filled by
:func:`~hcqr_dspy.evaluation.loop.run_resumable`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from functools import cached_property
from pathlib import Path
from typing import Any

from hcqr_dspy import data_sources
from hcqr_dspy.errors import RunError
from hcqr_dspy.evaluation.folder_format import StoredConfig, first_recorded, read_config, stored_config
from hcqr_dspy.evaluation.folders import CONFIG, JUDGMENTS, OPTION_PROBS, PREDICTIONS, SESSIONS, claim_run_dir
from hcqr_dspy.evaluation.lock import WriterLock
from hcqr_dspy.evaluation.metrics import summarize
from hcqr_dspy.evaluation.outages import disk_full, disk_full_error
from hcqr_dspy.evaluation.provenance import malformed_fields, session_record
from hcqr_dspy.evaluation.records import JsonlTable, atomic_write_text, read_json_object, remove_empty_folders
from hcqr_dspy.evaluation.run_config import MUTABLE_KEYS, moved_inputs, refuse_other_config
from hcqr_dspy.evaluation.run_questions import rebuild_question_sample, reload_questions
from hcqr_dspy.evaluation.tracebacks import clear_traceback, save_traceback

METRICS = "metrics.json"
DUR_METRICS = "dur.json"


class RunFolder:
    """One evaluation's folder (see the module docstring for its files).

    Use :meth:`create` to start or resume a run with a configuration, and
    :meth:`open` to read a finished or partial one.

    Example:
        >>> folder = RunFolder.open("runs/medqa/hcqr-local-n100-s0-1a2b3c4d")
        >>> folder.method, folder.dataset_name, len(folder.rows())
        ('hcqr', 'medqa', 100)
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.predictions = JsonlTable(self.path / PREDICTIONS, "question")
        self.judgments_table = JsonlTable(self.path / JUDGMENTS, "judgment")
        self.option_probs_table = JsonlTable(self.path / OPTION_PROBS, "option probabilities")
        self.sessions_table = JsonlTable(self.path / SESSIONS, "session", key="session")
        self.writer: WriterLock | None = None
        self._made: list[Path] = []  # folders claim() created, removed by release() while empty
        self._written: list[Path] = []  # the config.json start() wrote into a folder without one, until a session
        self.first_recorded: list[str] = []  # identities start() recorded that the resumed configuration lacked
        self._stored: StoredConfig | None = None  # config.json as last read or written

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r})"

    # -- creating and opening -------------------------------------------------
    @classmethod
    def create(cls, path: str | Path, config: dict[str, Any], command: str = "eval") -> RunFolder:
        """:meth:`claim` the folder for ``command`` and :meth:`start` it with ``config`` (released again if that
        fails); hold it until :meth:`release`.

        Raises:
            RunError: see :meth:`claim` and :meth:`start`.
        """
        folder = cls.claim(path, command)
        try:
            folder.start(config)
        except BaseException:
            folder.release()
            raise
        return folder

    @classmethod
    def claim(cls, path: str | Path, command: str = "eval") -> RunFolder:
        """Become the folder's one writer before anything is written or any LM is asked: the folder is
        created if needed and its :class:`WriterLock` taken for ``command``. :meth:`release` removes again the
        folders this call created while they are empty (a refused command leaves nothing).

        Raises:
            RunError: see :func:`~hcqr_dspy.evaluation.folders.claim_run_dir` (another live process writes the
                folder, it is a file, holds other records or is not writable).
        """
        folder = cls(path)
        folder.writer, folder._made = claim_run_dir(folder.path, command)
        return folder

    def start(self, config: dict[str, Any]) -> list[str]:
        """Write ``config`` into a claimed folder, or check it against the one there (resume).

        Call only after every input (LM, index, questions, program) has been checked: this is the first write of
        the run. What must match is :mod:`~hcqr_dspy.evaluation.run_config`'s: inputs found at other places resume
        the run, and ``config.json`` then records the new places (:func:`~.folder_format.stored_config`).

        Returns:
            The locations that moved since the folder was written (``dataset``, ``index.path`` ...;
            :func:`~hcqr_dspy.evaluation.run_config.moved_inputs`), empty for a new folder.

        Raises:
            RunError: its ``config.json`` differs in what decides a row (:meth:`refuse_other_config`), or is unreadable.
        """
        cpath = self.path / CONFIG
        moved: list[str] = []
        self._written = [] if cpath.exists() else [cpath]
        self._stored = None
        if cpath.exists():
            self.refuse_other_config(config)
            old = self.stored.config
            moved = moved_inputs(old, config)
            self.first_recorded = first_recorded(self.stored.unrecorded, config)
            config = {**config, **{k: old.get(k) for k in MUTABLE_KEYS}}
        self._write_config(config)
        return moved

    def refuse_other_config(self, config: dict[str, Any], advice: str = "use another --run-dir or remove it") -> None:
        """:func:`~hcqr_dspy.evaluation.run_config.refuse_other_config` against the folder's ``config.json``; a
        folder without one takes any. RunError: also ``config.json`` unreadable or of a newer format."""
        if (self.path / CONFIG).exists():
            refuse_other_config(self.path, self.stored.config, config, self.stored.unrecorded, advice)

    def release(self) -> None:
        """Release :meth:`claim`'s writer lock (if any); the folders it created are removed again while empty."""
        if self.writer is not None:
            self.writer.release()
            self.writer = None
        remove_empty_folders(self._made)
        self._made = []

    @classmethod
    def open(cls, path: str | Path) -> RunFolder:
        """An existing run folder (it needs ``config.json``).

        Raises:
            RunError: not a run folder, or an unreadable ``config.json``.
        """
        folder = cls(path)
        if not folder.path.exists():
            raise RunError(f"run folder {folder.path} does not exist")
        if not (folder.path / CONFIG).is_file():
            raise RunError(f"{folder.path} is not a run folder (no {CONFIG}; made by `hcqr eval`)")
        _ = folder.config  # read and check it now
        return folder

    def _write_config(self, config: dict[str, Any]) -> None:
        """Write ``config`` (places as here) in the folder's format (:func:`~.folder_format.stored_config`)."""
        stored = stored_config(config, self.path, self.stored if (self.path / CONFIG).is_file() else None)
        atomic_write_text(self.path / CONFIG, json.dumps(stored, indent=2, sort_keys=True) + "\n")
        self._stored = None
        self.__dict__.pop("config", None)

    @property
    def stored(self) -> StoredConfig:
        """``config.json`` as read (:func:`~.folder_format.read_config`). Raises RunError: unreadable, newer format."""
        if self._stored is None:
            self._stored = read_config(read_json_object(f := self.path / CONFIG, "run configuration"), self.path, f)
        return self._stored

    # -- configuration -------------------------------------------------------
    @cached_property
    def config(self) -> dict[str, Any]:
        """The run's configuration, its inputs' places resolved on this machine
        (:func:`~hcqr_dspy.evaluation.folder_format.read_config`; no format number).

        Raises:
            RunError: unreadable, of a newer format, or lacking ``method`` or ``dataset``.
        """
        config = self.stored.config
        missing = [k for k in ("method", "dataset") if not config.get(k)]
        if missing:
            raise RunError(f"{self.path / CONFIG} lacks {', '.join(missing)}: not written by `hcqr eval`")
        return config

    @property
    def method(self) -> str:
        return self.config["method"]

    @property
    def dataset(self) -> str:
        """The dataset file (absolute path) or hub name the run read its questions from."""
        return self.config["dataset"]

    @property
    def dataset_name(self) -> str:
        """The dataset's name: the file stem (``medqa``), a saved dataset's folder name, an MLflow dataset's NAME or
        ID, or the hub name (:func:`hcqr_dspy.data_sources.label`)."""
        return data_sources.label(self.dataset)

    @property
    def questions_record(self) -> dict[str, Any]:
        """``count``, ``limit``, ``seed``, ``ids_sha256``, ``content_sha256`` (format 1 may lack it), and
        ``labelled: false`` for questions read without gold answers (``hcqr predict``)."""
        return self.config.get("questions") or {}

    @property
    def lm_spec(self) -> str | None:
        return (self.config.get("lm") or {}).get("spec")

    @property
    def index_path(self) -> str | None:
        """The index folder the run retrieved from; ``None`` for methods without retrieval."""
        return (self.config.get("index") or {}).get("path")

    @property
    def saved_program(self) -> dict[str, Any] | None:
        return self.config.get("saved_program")

    @property
    def mlflow_run_id(self) -> str | None:
        return self.config.get("mlflow_run_id")

    def set_mlflow_run_id(self, run_id: str | None) -> None:
        """Record the MLflow run that tracks this folder (kept when the run resumes)."""
        if run_id != self.mlflow_run_id:
            self._write_config({**self.config, "mlflow_run_id": run_id})

    def set_dataset(self, place: str) -> None:
        """Record the dataset's new place under the writer lock (``run_questions.move_dataset`` checks it)."""
        with WriterLock(self.path, "move-dataset"):
            self._stored = None
            self._write_config({**self.stored.config, "dataset": place})

    def load_questions(self) -> dict[str, Any]:
        """The run's questions (from its dataset), by id.

        Raises:
            RunError: the dataset cannot be read any more, or its questions are not
                the ones the run was made with (content fingerprint differs).
        """
        return reload_questions(self)

    def question_sample(self) -> list[str]:
        """Ids of every question the run was asked to answer, in run order, finished or not.

        Rebuilt from the dataset with the run's recorded ``limit`` and ``seed``
        (:func:`hcqr_dspy.data.select`) and checked against the recorded
        ``ids_sha256``, so two runs over the same sample give the same list
        however far each has got.

        Raises:
            RunError: the dataset cannot be read, or the rebuilt sample is not the
                recorded one (a run made with an explicit id list, or a changed file).
        """
        return rebuild_question_sample(self)

    # -- records --------------------------------------------------------------
    def rows(self) -> list[dict[str, Any]]:
        """The prediction rows (one per finished question), in file order (:meth:`iter_rows`, all in a list)."""
        return list(self.iter_rows())

    def iter_rows(self) -> Iterator[dict[str, Any]]:
        """The prediction rows in file order, read as consumed; RunError: a question recorded twice (an edited file)."""
        seen: set[str] = set()
        for r in self.predictions.iter():
            if r["qid"] in seen:
                raise RunError(
                    f"{self.predictions.path}: question {r['qid']!r} is recorded twice; delete one of the lines"
                )
            seen.add(r["qid"])
            yield r

    def judgments(self) -> list[dict[str, Any]]:
        """DUR judgments, checked against the rows: malformed, repeated or foreign ones are refused.

        Raises:
            RunError: a judgment lacks ``valid``/``label``/``passage_queries``, a question is judged
                twice, or judgments name questions this run does not hold.
        """
        judgments = self.judgments_table.read()
        file = self.judgments_table.path
        seen: set[str] = set()
        for j in judgments:
            if (
                not isinstance(j.get("valid"), bool)
                or "label" not in j
                or not isinstance(j.get("passage_queries"), list)
            ):
                raise RunError(
                    f"{file}: the judgment of {j['qid']!r} lacks 'valid', 'label' or 'passage_queries' "
                    "(not written by `hcqr judge`); repair or delete that line"
                )
            if j["qid"] in seen:
                raise RunError(f"{file}: question {j['qid']!r} is judged twice; delete one of the lines")
            seen.add(j["qid"])
        foreign = sorted(seen - {r["qid"] for r in self.rows()})
        if foreign:
            raise RunError(
                f"{file} judges {len(foreign)} question(s) this run does not hold "
                f"({', '.join(foreign[:5])}); was it copied from another run?"
            )
        return judgments

    def record_session(self, command: str, lm: Any = None, questions_in_flight: int | None = None) -> dict[str, Any]:
        """Append this session's record to ``sessions.jsonl``
        (:func:`~hcqr_dspy.evaluation.provenance.session_record`, with ``questions_in_flight``),
        numbered after the existing ones, with how many predictions and judgments the folder held before it.

        Returns:
            The record written.

        Raises:
            RunError: ``sessions.jsonl`` is malformed, or cannot be written.
        """
        previous = self.sessions()
        record = {
            "session": len(previous) + 1,
            **session_record(command, lm, questions_in_flight),
            "predictions_before": len(self.predictions.read()),
            "judgments_before": len(self.judgments_table.read()),
        }
        self.sessions_table.drop_partial_tail()
        try:
            self.sessions_table.append(record)
        except OSError as exc:
            for file in self._written:  # a new run refused at its first record: release() removes its folders
                file.unlink(missing_ok=True)
            if disk_full(exc):
                raise disk_full_error(exc, f"nothing was recorded in {self.path}") from None
            raise RunError(f"cannot write {self.sessions_table.path}: {exc.strerror or exc}") from None
        self._written, self._made = [], []
        return record

    def sessions(self) -> list[dict[str, Any]]:
        """The sessions that wrote this folder, oldest first (empty where ``sessions.jsonl`` is absent: format 1).

        Raises:
            RunError: a line that is not a session record, or one whose fields have the wrong types
                (file and line named).
        """
        records = self.sessions_table.read()
        for lineno, record in enumerate(records, start=1):
            wrong = malformed_fields(record)
            if wrong:
                raise RunError(
                    f"{self.sessions_table.path}: session record {lineno} has missing or malformed "
                    f"{', '.join(wrong)} (not written by hcqr-dspy); repair or delete that line"
                )
        return records

    def write_json(self, name: str, value: dict[str, Any]) -> Path:
        """Write a summary file (``metrics.json``, ``dur.json`` ...) of this folder atomically (a temporary
        file renamed over it), so a failed write (disk full) leaves the previous version whole.

        Raises:
            DiskFullError: the disk is full. OSError: another write failure.
        """
        path = self.path / name
        atomic_write_text(path, json.dumps(value, indent=2) + "\n")
        return path

    def read_json(self, name: str) -> dict[str, Any]:
        """A summary file of this folder, ``{}`` when absent.

        Raises:
            RunError: present but unreadable.
        """
        path = self.path / name
        return read_json_object(path) if path.is_file() else {}

    def write_metrics(self, rows: Iterable[dict[str, Any]] | None = None) -> dict[str, Any]:
        """Summarize ``rows`` (default: all saved rows, streamed from the file) into ``metrics.json``."""
        metrics = summarize(self.iter_rows() if rows is None else rows)
        self.write_json(METRICS, metrics)
        return metrics

    def save_traceback(self, qid: str, exc: BaseException) -> Path | None:
        """Write ``exc``'s traceback to ``tracebacks/`` (named by a hash of ``qid``: :mod:`.tracebacks`)."""
        return save_traceback(self.path, qid, exc)

    def clear_traceback(self, qid: str) -> None:
        """Remove the question's traceback file, the question having a row now."""
        clear_traceback(self.path, qid)

    def files(self) -> list[Path]:
        """The folder's record files (for artifact logging): top-level files, not hidden ones."""
        return sorted(f for f in self.path.iterdir() if f.is_file() and not f.name.startswith("."))
