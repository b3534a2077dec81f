"""Folders a command is given: the same run folder named twice, and an ``--out`` folder that holds another tool's
records (a file, a run folder, an index folder)."""

from __future__ import annotations

from pathlib import Path

from hcqr_dspy.evaluation.run_folder import CONFIG


def repeated_folder(path: str | Path, seen: dict[Path, str]) -> str | None:
    """``"run folder <path> is given twice (also as <earlier>)"`` when ``path`` resolves to a folder already in
    ``seen`` (resolved folder -> as given); else records it there and returns ``None``."""
    real = Path(path).resolve()
    if real in seen:
        return f"run folder {path} is given twice (also as {seen[real]})"
    seen[real] = str(path)
    return None


def out_folder_fault(out: Path, what: str) -> str | None:
    """Why ``--out`` folder ``out`` cannot hold ``what`` (a comparison, a replay): it is a file, a run folder or an
    index folder (another tool's records, which the report's files would mix with); ``None`` when it can."""
    from hcqr_dspy.retrieval.base import MANIFEST

    if out.exists() and not out.is_dir():
        return f"--out {out} exists and is not a folder; choose another --out"
    for marker, kind in ((CONFIG, "a run folder"), (MANIFEST, "an index folder")):
        if (out / marker).exists():
            return f"--out {out} is {kind}; write the {what} to a folder of its own"
    return None
