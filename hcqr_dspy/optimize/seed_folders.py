"""The folder of a replicate compile (``hcqr compile --seeds``): one saved program per compile seed, in
``<out>/seed-<N>/``."""

from __future__ import annotations

import re
from pathlib import Path

SEED_FOLDER = re.compile(r"^seed-(\d+)$")


def seed_folder(root: str | Path, seed: int) -> Path:
    """Where the program compiled with ``seed`` is saved in a replicate compile's folder ``root``."""
    return Path(root) / f"seed-{seed}"


def seed_folders(path: str | Path) -> dict[int, Path]:
    """The saved programs of a replicate compile (``hcqr compile --seeds``): ``{seed: PATH/seed-<seed>}`` for each
    subfolder holding a ``meta.json``, in seed order; empty for any other folder."""
    folder = Path(path)
    if not folder.is_dir() or (folder / "meta.json").is_file():
        return {}
    found = {}
    for sub in folder.iterdir():
        if (match := SEED_FOLDER.match(sub.name)) and (sub / "meta.json").is_file():
            found[int(match.group(1))] = sub
    return dict(sorted(found.items()))


def expand_replicates(programs: dict[str, str]) -> dict[str, str]:
    """``{name: program reference}`` with each replicate-compile folder (:func:`seed_folders`) replaced by one entry
    per saved seed, named ``<name>-seed-<N>``; other references (folders, ``runs:/`` and ``models:/`` URIs) as they
    are, in order.

    Raises:
        ValueError: two entries of one name (a cell ``x-seed-0`` beside a replicate folder ``x``)."""
    out: dict[str, str] = {}
    for name, ref in programs.items():
        seeds = {} if ref.startswith(("runs:/", "models:/")) else seed_folders(ref)
        entries = {f"{name}-seed-{seed}": str(sub) for seed, sub in seeds.items()} if seeds else {name: ref}
        for entry, where in entries.items():
            if entry in out:
                raise ValueError(f"program cell {entry!r} is named twice (once by a folder of replicate compiles)")
            out[entry] = where
    return out
