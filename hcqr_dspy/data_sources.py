"""Question sources other than a file: a Hugging Face dataset saved to disk and an MLflow evaluation dataset.

Each reader returns the source's question rows (``{qid, question, options, answer}`` dicts, in the source's
order); :func:`hcqr_dspy.data.load_questions` checks them as it checks a JSON file's rows.

The forms of ``--dataset`` read here:

``FOLDER``
    a folder ``datasets.Dataset.save_to_disk`` wrote (one split);
``FOLDER:SPLIT``
    one split of a folder ``datasets.DatasetDict.save_to_disk`` wrote (a DatasetDict needs one);
``mlflow:NAME``, ``mlflow:ID``
    an MLflow evaluation dataset (``mlflow.genai.datasets``) by name or id (``d-`` and 32 hex digits) in the
    command's MLflow store, which fills in ``@STORE`` (:func:`with_store`);
``mlflow:REF@STORE``
    the same in ``STORE``: a store folder (its ``mlflow.db``) or a tracking URI. A name holding ``@`` is given by
    its id.

A saved dataset's columns, and an MLflow record's fields, are the MIRAGE fields: ``question``, ``options`` (an
object keyed by letter, or a list labelled A, B, ...), ``answer`` (the gold letter) and ``qid`` or ``id``. An
MLflow record holds ``question``, ``options`` and ``qid`` in its inputs (or ``qid`` as a tag) and ``answer`` in its
expectations, as :func:`hcqr_dspy.tracking.datasets.questions_dataset` logs them; records are read in the order of
their tag ``position`` (0, 1, ...), those without one after them in the natural order of their qids.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from hcqr_dspy.errors import DataError

MLFLOW = "mlflow:"
DATASET_ID = re.compile(r"d-[0-9a-f]{32}")
POSITION_TAG = "position"  # a record's place in its question set (0, 1, ...)


def is_mlflow(source: str | Path) -> bool:
    """Whether ``source`` names an MLflow evaluation dataset (``mlflow:...``)."""
    return str(source).startswith(MLFLOW)


def mlflow_parts(source: str) -> tuple[str, str | None]:
    """``(REF, STORE)`` of ``mlflow:REF[@STORE]``; ``STORE`` is ``None`` when not given.

    Raises:
        DataError: no REF, or an empty STORE after ``@``.
    """
    ref, at, store = source[len(MLFLOW) :].partition("@")
    if not ref.strip() or (at and not store.strip()):
        raise DataError(f"--dataset {source!r}: give mlflow:NAME or mlflow:ID, optionally followed by @STORE")
    return ref.strip(), store.strip() or None


def with_store(source: str, uri: str) -> str:
    """``source`` with the MLflow store ``uri`` filled in when it is ``mlflow:REF`` without one; others unchanged."""
    if is_mlflow(source) and mlflow_parts(source)[1] is None:
        return f"{source}@{uri}"
    return source


def store_uri(store: str) -> str:
    """The tracking URI of ``STORE``: a URI as it is, a folder as ``sqlite:///<folder>/mlflow.db`` (absolute)."""
    if "://" in store or store.startswith("sqlite:"):
        return store
    return f"sqlite:///{Path(store).expanduser().resolve() / 'mlflow.db'}"


def hf_folder(source: str | Path) -> tuple[Path, str | None] | None:
    """``(folder, split)`` when ``source`` is an existing folder, or ``FOLDER:SPLIT`` over one; else ``None``."""
    text = str(source)
    if is_mlflow(text):
        return None
    if Path(text).is_dir():
        return Path(text), None
    head, colon, split = text.rpartition(":")
    if colon and head and split and Path(head).is_dir():
        return Path(head), split
    return None


def place(source: str | Path) -> str:
    """Where a source lies, as a run's ``config.json`` records it: an existing file or saved dataset's folder as an
    absolute path (``:SPLIT`` kept), an MLflow dataset with its store as a tracking URI, a hub name as it is."""
    text = str(source)
    if is_mlflow(text):
        ref, store = mlflow_parts(text)
        return text if store is None else f"{MLFLOW}{ref}@{store_uri(store)}"
    folder = hf_folder(text)
    if folder is not None:
        return str(folder[0].resolve()) + (f":{folder[1]}" if folder[1] else "")
    return str(Path(text).resolve()) if Path(text).exists() else text


def label(source: str | Path) -> str:
    """A source's short name: an MLflow dataset's NAME or ID, a file's stem (``medqa`` for ``.../medqa.json``), a
    saved dataset's folder name (its split left out), a hub name as it is."""
    text = str(source)
    if is_mlflow(text):
        return mlflow_parts(text)[0]
    folder = hf_folder(text)
    if folder is not None:
        return folder[0].resolve().name
    head, colon, _ = text.rpartition(":")
    if colon and head.startswith("/"):  # a saved dataset's split recorded at a path that does not hold it
        text = head
    path = Path(text)
    return path.stem if path.suffix or path.exists() or text.startswith("/") else text


def dataset_rows(dataset: Any, where: str, labelled: bool) -> list[dict[str, Any]]:
    """The question rows of a Hugging Face ``datasets.Dataset`` (MIRAGE columns; ``qid``, else ``id``, else the row
    number is the id). A missing option of an ``options`` struct column (Arrow gives it as ``None``) is left out.

    Raises:
        DataError: a column ``question``, ``options`` or (``labelled``) ``answer`` missing (the columns named).
    """
    columns = list(dataset.column_names)
    missing = [c for c in ("question", "options", *(["answer"] if labelled else [])) if c not in columns]
    if missing:
        raise DataError(
            f"{where}: its columns are {', '.join(columns) or 'none'}; a question dataset needs question, options, "
            f"answer (and qid or id): {', '.join(missing)} missing"
        )
    key = "qid" if "qid" in columns else "id" if "id" in columns else None
    rows = []
    for i, row in enumerate(dataset):
        options = row["options"]
        if isinstance(options, dict):
            options = {k: v for k, v in options.items() if v is not None}
        qid = row[key] if key is not None and row[key] is not None else i
        rows.append({"qid": str(qid), "question": row["question"], "options": options, "answer": row.get("answer")})
    return rows


def read_saved_dataset(folder: Path, split: str | None, labelled: bool) -> list[dict[str, Any]]:
    """The question rows of a folder ``datasets`` ``save_to_disk`` wrote (a DatasetDict's ``split``).

    Raises:
        DataError: not such a folder, a DatasetDict without ``split`` or without that split, a split given for a
            single Dataset, an unreadable folder, or missing columns (:func:`dataset_rows`).
    """
    where = str(folder) + (f":{split}" if split else "")
    is_dict = (folder / "dataset_dict.json").is_file()
    if not is_dict and not (folder / "state.json").is_file():
        raise DataError(
            f"--dataset {folder} is a folder but not a saved Hugging Face dataset (no state.json or "
            "dataset_dict.json from `save_to_disk`); give a question file, a saved dataset's folder or mlflow:NAME"
        )
    try:
        import datasets

        loaded = datasets.load_from_disk(str(folder))
    except Exception as exc:  # datasets raises many kinds for a damaged folder
        raise DataError(f"{where}: not readable as a saved Hugging Face dataset ({_first_line(exc)})") from None
    if isinstance(loaded, datasets.DatasetDict):
        splits = list(loaded)
        if split is None:
            raise DataError(
                f"--dataset {folder} holds the splits {', '.join(splits)} (a DatasetDict): name one, "
                f"e.g. {folder}:{splits[0] if splits else 'test'}"
            )
        if split not in loaded:
            raise DataError(f"--dataset {where}: no split {split!r}; its splits are {', '.join(splits)}")
        loaded = loaded[split]
    elif split is not None:
        raise DataError(f"--dataset {where}: {folder} holds one split (a Dataset, not a DatasetDict); drop :{split}")
    return dataset_rows(loaded, where, labelled)


def read_mlflow_dataset(source: str) -> list[dict[str, Any]]:
    """The question rows of an MLflow evaluation dataset ``mlflow:REF@STORE`` (see the module docstring), in
    position order.

    Nothing is written: an SQLite store that does not exist is refused before MLflow opens it.

    Raises:
        DataError: no store named, no store there, no dataset of that name or id, several of that name, records
            without ``question`` / ``options`` inputs (their fields named) or without a qid, or a store MLflow
            cannot read.
    """
    from mlflow.exceptions import MlflowException
    from sqlalchemy.exc import SQLAlchemyError  # an SQLite store's own errors (not a database, locked)

    ref, store = mlflow_parts(source)
    if store is None:
        raise DataError(f"--dataset {source}: no MLflow store named; give {MLFLOW}{ref}@STORE (a folder or URI)")
    uri = store_uri(store)
    database = _sqlite_file(uri)
    if database is not None and not database.is_file():
        raise DataError(f"--dataset {MLFLOW}{ref}: no MLflow store at {store}")
    try:
        dataset_id = _find_dataset(ref, uri, store)
        # the records as MLflow's own EvaluationDataset.records loads them, from this store (not the global one)
        from mlflow.tracking._tracking_service.utils import _get_store

        records, _ = _get_store(uri)._load_dataset_records(dataset_id, max_results=None)
    except (MlflowException, SQLAlchemyError, OSError) as exc:
        raise DataError(
            f"--dataset {MLFLOW}{ref}: the MLflow store {store} cannot be read ({_first_line(exc)})"
        ) from None
    return _record_rows(records or [], f"{MLFLOW}{ref}")


def _find_dataset(ref: str, uri: str, store: str) -> str:
    """The id of the dataset ``ref`` (an id or a unique name) in the store at ``uri``."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient(tracking_uri=uri)
    if DATASET_ID.fullmatch(ref):
        try:
            return client.get_dataset(ref).dataset_id
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
            raise DataError(f"--dataset {MLFLOW}{ref}: no evaluation dataset with that id in {store}") from None
    quoted = ref.replace("'", "''")
    found = list(client.search_datasets(filter_string=f"name = '{quoted}'", max_results=10))
    if len(found) > 1:
        ids = ", ".join(f"{MLFLOW}{d.dataset_id}" for d in found[:3])
        raise DataError(
            f"--dataset {MLFLOW}{ref}: {len(found)} evaluation datasets in {store} have that name; "
            f"give one by id: {ids}"
        )
    if not found:
        names = sorted({d.name for d in client.search_datasets(max_results=50)})
        held = ", ".join(names[:8]) + (" ..." if len(names) > 8 else "") if names else "none"
        raise DataError(f"--dataset {MLFLOW}{ref}: no evaluation dataset of that name in {store} (it holds: {held})")
    return found[0].dataset_id


def _record_rows(records: list[Any], where: str) -> list[dict[str, Any]]:
    """Question rows of MLflow dataset records, in position order (see the module docstring)."""
    if records and not any("question" in (r.inputs or {}) and "options" in (r.inputs or {}) for r in records):
        inputs = sorted({k for r in records for k in (r.inputs or {})})
        expectations = sorted({k for r in records for k in (r.expectations or {})})
        raise DataError(
            f"{where}: its records' inputs hold {', '.join(inputs) or 'nothing'} and their expectations "
            f"{', '.join(expectations) or 'nothing'}; questions need the inputs question and options (and qid) "
            "and the expectation answer"
        )
    rows = []
    for record in records:
        inputs, tags = record.inputs or {}, record.tags or {}
        qid = inputs.get("qid", inputs.get("id", tags.get("qid")))
        if qid is None or not str(qid).strip():
            raise DataError(
                f"{where}: record {record.dataset_record_id} has no qid (the input qid or id, or the tag qid)"
            )
        rows.append(
            {
                "qid": str(qid),
                "question": inputs.get("question"),
                "options": inputs.get("options"),
                "answer": (record.expectations or {}).get("answer"),
                "position": tags.get(POSITION_TAG),
            }
        )
    rows.sort(key=_order)
    for row in rows:
        del row["position"]
    return rows


def _order(row: dict[str, Any]) -> tuple:
    position = str(row["position"]) if row["position"] is not None else ""
    if position.isdigit():
        return (0, int(position), ())
    return (1, 0, tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", row["qid"]) if p))


def _sqlite_file(uri: str) -> Path | None:
    """The database file of an ``sqlite:///`` URI (its query string dropped); ``None`` for another kind of store."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri[len("sqlite:///") :].split("?", 1)[0])


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "message", None) or exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
