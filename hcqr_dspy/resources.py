"""Files shipped inside the package: the demo data, the optimizer recipes and the experiment files.

In the repository they live in the top-level folders ``data/demo/``,
``optimizers/`` and ``experiments/``; ``hcqr_dspy/shipped/`` holds one
symbolic link to each, so a wheel built from the repository (setuptools
copies what the links point to; ``package-data`` in ``pyproject.toml``) and
an editable install (``pip install -e .``) both find them as package data of
``hcqr_dspy`` through :mod:`importlib.resources`, never relative to a source
tree or to the working folder.

Names given on the command line (``--recipe bootstrap_fewshot``, ``hcqr
experiment paper_main``) are looked up first in the working folder's own
``optimizers/`` or ``experiments/`` folder, then among the shipped files
(:func:`find`).
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from hcqr_dspy.errors import HCQRError

# kind -> (folder under hcqr_dspy/shipped, the working folder's own folder of that kind, file pattern)
KINDS = {
    "demo": ("demo", None, "*"),
    "recipe": ("optimizers", Path("optimizers"), "*.yaml"),
    "experiment": ("experiments", Path("experiments"), "*.yaml"),
}


def shipped_dir(kind: str) -> Path:
    """The installed folder of shipped files of ``kind`` (``demo``, ``recipe`` or ``experiment``).

    Raises:
        HCQRError: the package is installed without them (a broken or zipped install).
    """
    folder = files("hcqr_dspy").joinpath("shipped", KINDS[kind][0])
    if not isinstance(folder, Path) or not folder.is_dir():
        raise HCQRError(f"the shipped {kind} files are missing from this hcqr-dspy install ({folder}); reinstall it")
    return folder


def own_dir(kind: str) -> Path | None:
    """The working folder's own folder of ``kind`` (``./optimizers``, ``./experiments``), searched first."""
    return KINDS[kind][1]


def find(kind: str, name_or_path: str | Path, error: type[HCQRError]) -> tuple[Path, bool]:
    """A recipe or experiment file from a path (``.yaml`` may be left out) or a bare name.

    A path that exists wins; then ``./<own folder>/<name>.yaml``; then the shipped file of that name.

    Returns:
        ``(file, shipped)``: the file, and whether it was found by name among the shipped files.

    Raises:
        error: nothing found; the folders searched and the names there are listed.
    """
    p = Path(name_or_path)
    for candidate in (p, p.with_name(p.name + ".yaml")):
        if candidate.is_file():
            return candidate, False
    folders: list[tuple[Path, bool]] = []
    if not p.is_absolute() and len(p.parts) == 1:
        own, shipped = own_dir(kind), shipped_dir(kind)
        folders = [(own, False)] + ([(shipped, True)] if not _same(own, shipped) else [])
        for folder, is_shipped in folders:
            for candidate in (folder / p, folder / (p.name + ".yaml")):
                if candidate.is_file():
                    return candidate, is_shipped
    pattern = KINDS[kind][2]
    known = sorted({f.stem for folder, _ in folders if folder.is_dir() for f in folder.glob(pattern)})
    where = f"looked in {', '.join(f'{folder}/' for folder, _ in folders)}" if folders else "no such file"
    raise error(f"{kind} {str(name_or_path)!r} not found ({where}); {kind}s there: {', '.join(known) or '(none)'}")


def _same(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False
