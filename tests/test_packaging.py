"""The built package finds its shipped files: a wheel and an editable install, each in a fresh venv outside the repo.

The fresh venv reaches the heavy dependencies (DSPy, torch, MLflow ...) through a ``.pth`` line naming this
interpreter's site-packages; a path line does not run that folder's own ``.pth`` files, so the editable
install of the development checkout is not loaded there, and the test checks which copy of ``hcqr_dspy``
each command imported.
"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from helpers import TINY_ROWS, snippet, write_jsonl

REPO = Path(__file__).resolve().parents[1]
SOURCES = ["hcqr_dspy", "data", "optimizers", "experiments", "pyproject.toml", "README.md", "LICENSE"]

PROBE = """
import json, hcqr_dspy
from hcqr_dspy.data import load_questions
from hcqr_dspy.workflows.experiment_file import load_experiment
from hcqr_dspy.optimize.recipes import load_recipe
from hcqr_dspy.resources import shipped_dir
from hcqr_dspy.retrieval import load_corpus
demo = shipped_dir("demo")
exp = load_experiment("paper_main")
print(json.dumps({
    "package": hcqr_dspy.__file__,
    "demo": str(demo), "questions": len(load_questions(demo / "questions.json")),
    "passages": len(load_corpus(demo / "corpus.jsonl")),
    "recipes": {
        n: load_recipe(n).path
        for n in ("bootstrap_fewshot", "bootstrap_random_search", "mipro_light", "gepa", "labeled_fewshot")
    },
    "experiment": {"index": exp.index, "datasets": exp.datasets},
}))
"""


def run(args, cwd, env):
    out = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"{args} exited {out.returncode}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out.stdout


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A copy of the package's sources (links kept), so builds write nothing into the checkout."""
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(path, src / name)
    return src


def fresh_venv(folder: Path) -> Path:
    """A venv without pip whose only other packages are this interpreter's (a path line in a .pth file)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    python = folder / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    (site / "shared-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def pip(python: Path, *args: str, cwd: Path) -> None:
    run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", "--python", str(python), *args],
        cwd,
        os.environ.copy(),
    )


@pytest.mark.parametrize("install", ["wheel", "editable"])
def test_installed_package_finds_demo_recipes_and_experiments_from_another_folder(install, source, tmp_path):
    venv = tmp_path / "venv"
    python = fresh_venv(venv)
    if install == "wheel":
        dist = tmp_path / "dist"
        run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--no-build-isolation",
                "--no-index",
                "-w",
                str(dist),
                str(source),
            ],
            tmp_path,
            os.environ.copy(),
        )
        [wheel] = dist.glob("hcqr_dspy-*.whl")
        pip(python, "install", "--no-deps", "--no-index", str(wheel), cwd=tmp_path)
        home = (
            Path(
                run(
                    [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                    tmp_path,
                    os.environ.copy(),
                ).strip()
            )
            / "hcqr_dspy"
        )
    else:
        pip(python, "install", "--no-deps", "--no-build-isolation", "--no-index", "-e", str(source), cwd=tmp_path)
        home = source / "hcqr_dspy"

    # another working folder, laid out as the shipped paper_main expects: ./indexes/..., ../shared/data/...
    work = tmp_path / "elsewhere" / "work"
    from hcqr_dspy.retrieval import BM25Retriever, load_corpus

    corpus = load_corpus(write_jsonl(tmp_path / "corpus.jsonl", [snippet(*r) for r in TINY_ROWS]))
    BM25Retriever(corpus, show_progress=False).save(work / "indexes" / "medcorpus-bm25")
    bench = tmp_path / "elsewhere" / "shared" / "data" / "benchmark"
    bench.mkdir(parents=True)
    rows = {
        "0001": {
            "question": "A patient on digoxin sees yellow halos. Cause?",
            "options": {"A": "Digoxin toxicity", "B": "Graves disease"},
            "answer": "A",
        }
    }
    for name in ("medqa", "mmlu"):
        (bench / f"{name}.json").write_text(json.dumps(rows))

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing of the checkout on the path
    env.update(HF_HUB_OFFLINE="1", LITELLM_LOCAL_MODEL_COST_MAP="True")
    found = json.loads(run([str(python), "-c", PROBE], work, env).strip().splitlines()[-1])
    assert Path(found["package"]).parent == home and REPO not in Path(found["package"]).resolve().parents
    assert Path(found["demo"]) == home / "shipped" / "demo"
    assert found["questions"] == 20 and found["passages"] == 229
    assert all(Path(p) == home / "shipped" / "optimizers" / f"{n}.yaml" for n, p in found["recipes"].items())
    assert found["experiment"]["index"] == str(work / "indexes" / "medcorpus-bm25")
    assert found["experiment"]["datasets"] == {n: str(bench / f"{n}.json") for n in ("medqa", "mmlu")}
    if install == "wheel":  # the wheel holds copies, not links into a source tree
        assert (
            not (home / "shipped" / "demo").is_symlink()
            and not (home / "shipped" / "demo" / "questions.json").is_symlink()
        )

    hcqr = str(venv / "bin" / "hcqr")
    assert "--index" in run([hcqr, "demo", "--help"], work, env)
    out = run([hcqr, "experiment", "paper_main", "--check", "--datasets", "medqa"], work, env)
    assert out.startswith("paper_main: valid (1 dataset(s) x 8 method(s), lm local)"), out
    failed = subprocess.run(
        [hcqr, "compile", "--recipe", "nope", "--train", "x.json", "--out", "p", "--no-mlflow"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert failed.returncode == 2
    assert (
        f"recipe 'nope' not found (looked in optimizers/, {home / 'shipped' / 'optimizers'}/); recipes there: "
        "bootstrap_fewshot, bootstrap_grounded, bootstrap_random_search, gepa, gepa_gold_prob, labeled_fewshot, "
        "mipro_instructions, mipro_light, simba"
    ) in failed.stderr
