"""`hcqr index` / `hcqr search`: output and exit code 2 with one clear message on bad input."""

import json

import pytest
from helpers import snippet, write_jsonl

from hcqr_dspy.cli import main


@pytest.fixture
def bm25_index(tmp_path, tiny_corpus_file, capsys):
    out = tmp_path / "idx"
    assert main(["index", "--corpus", str(tiny_corpus_file), "--retriever", "bm25", "--out", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passages"] == 8 and report["size_bytes"] > 0
    assert report["retriever"] == "bm25" and "backend" not in report  # BM25 has no vector store
    return out


def test_index_then_search_prints_ranked_titles(bm25_index, capsys):
    assert (
        main(["search", "--index", str(bm25_index), "--k", "2", "digoxin yellow vision", "ptosis acetylcholine"]) == 0
    )
    out = capsys.readouterr().out
    assert "## digoxin yellow vision" in out and "## ptosis acetylcholine" in out
    first = out.split("## ptosis")[0]
    assert "  1  " in first and "[p3] Digoxin toxicity" in first
    assert "[p7] Myasthenia gravis" in out.split("## ptosis")[1]


def error_of(capsys, argv):
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    return code, err


def test_search_empty_query_exit_2(bm25_index, capsys):
    code, err = error_of(capsys, ["search", "--index", str(bm25_index), "  "])
    assert code == 2 and err == ["hcqr: error: query 1 is empty"]


def test_search_bad_k_exit_2(bm25_index, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["search", "--index", str(bm25_index), "--k", "0", "anemia"])
    assert exc.value.code == 2
    assert "expected a positive integer, got 0" in capsys.readouterr().err


def test_search_index_for_another_corpus_exit_2(bm25_index, tmp_path, capsys):
    other = write_jsonl(tmp_path / "other.jsonl", [snippet("z", "Z", "something else")])
    code, err = error_of(capsys, ["search", "--index", str(bm25_index), "--corpus", str(other), "anemia"])
    assert code == 2 and len(err) == 1 and "was built for corpus" in err[0] and "other.jsonl" in err[0]


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "holds no passages"),
        (b'{"id": "a", "title": "t"}\n', "bad.jsonl:1: row 'a' has no 'content'"),
        (b'{"id": "a", "content": "x"}\n{"id": "a", "content": "y"}\n', "bad.jsonl:2: duplicate passage id 'a'"),
        (b'{"id": "a", "content": "\xff"}\n', "bad.jsonl:1: not valid UTF-8"),
    ],
)
def test_index_bad_corpus_exit_2(tmp_path, capsys, content, message):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(content)
    out = tmp_path / "idx"
    code, err = error_of(capsys, ["index", "--corpus", str(bad), "--retriever", "bm25", "--out", str(out)])
    assert code == 2 and len(err) == 1 and message in err[0]
    assert not out.exists()


def test_search_not_an_index_exit_2(tmp_path, capsys):
    code, err = error_of(capsys, ["search", "--index", str(tmp_path), "anemia"])
    assert code == 2 and "not an hcqr index folder" in err[0]


QUESTIONS = {"x1": {"question": "Which?", "options": {"A": "a", "B": "b"}, "answer": "A"}}


@pytest.fixture
def bench_file(tmp_path):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(QUESTIONS))
    return path


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--method", "magic"], "unknown method 'magic'; choose one of cot, hcqr, hcqr_hypothesis"),
        (["--lm", "gpt-4o"], "unknown --lm spec 'gpt-4o'"),
        (["--lm", "local:nope"], "unknown packaged model 'nope'"),
        (["--method", "hcqr"], "method 'hcqr' needs --index"),
    ],
)
def test_eval_bad_input_exit_2_before_any_lm_call(bench_file, tmp_path, capsys, extra, message):
    argv = ["eval", "--dataset", str(bench_file), "--no-mlflow", "--run-dir", str(tmp_path / "run"), *extra]
    code, err = error_of(capsys, argv)
    assert code == 2 and len(err) == 1 and message in err[0]
    assert not (tmp_path / "run").exists()


def test_eval_malformed_question_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"x1": {"question": "Which?", "options": {"A": "a"}, "answer": "A"}}))
    code, err = error_of(capsys, ["eval", "--method", "cot", "--dataset", str(bad), "--no-mlflow"])
    assert code == 2 and "has 1 option(s); at least two are needed" in err[0]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--question", "Which?", "--option", "A=x"], "at least two are needed"),
        (["--question", "Which?", "--option", "A=x", "--option", "C=y"], "labels must be the letters A, B"),
        (["--question", "Which?", "--option", "Ax"], "must look like A=text"),
        ([], "give --question"),
    ],
)
def test_ask_bad_question_exit_2(capsys, argv, message):
    code, err = error_of(capsys, ["ask", "--method", "cot", *argv])
    assert code == 2 and message in err[0]


def test_ui_refuses_missing_store(tmp_path, capsys):
    code, err = error_of(capsys, ["ui", "--mlflow-dir", str(tmp_path / "none")])
    assert code == 2 and "no MLflow store" in err[0]


def test_index_out_under_a_file_fails_before_building(tmp_path, tiny_corpus_file, capsys):
    blocker = tmp_path / "precious.txt"
    blocker.write_text("keep")
    code, err = error_of(capsys, ["index", "--corpus", str(tiny_corpus_file), "--out", str(blocker / "idx")])
    assert code == 2 and "cannot create the folder for index" in err[0]
    assert blocker.read_text() == "keep"


def test_ui_binds_to_localhost_unless_told_otherwise(tmp_path):
    from hcqr_dspy.cli.main import build_parser
    from hcqr_dspy.tracking.ui import ui_command

    args = build_parser().parse_args(["ui"])
    cmd = ui_command(tmp_path, host=args.host)
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
    cmd = ui_command(tmp_path, host="0.0.0.0")
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0"


def test_ask_json_not_utf8_or_not_json_is_one_line(tmp_path, capsys):
    bad = tmp_path / "q.json"
    bad.write_bytes(b'{"question": "Caf\xe9?", "options": {"A": "x", "B": "y"}}')
    code, err = error_of(capsys, ["ask", "--method", "cot", "--json", str(bad)])
    assert code == 2 and len(err) == 1 and "q.json:1: not valid UTF-8 text (byte 0xe9" in err[0]
    bad.write_text('{"question": "Which?",\n "options": ')
    code, err = error_of(capsys, ["ask", "--method", "cot", "--json", str(bad)])
    assert code == 2 and len(err) == 1 and "q.json:2: not valid JSON" in err[0]


def test_parser_names_are_the_registries():
    from hcqr_dspy.cli.common import FUSION_STRATEGIES, HYPOTHESIS_STYLES, RETRIEVER_KINDS
    from hcqr_dspy.programs import signatures
    from hcqr_dspy.retrieval import KINDS
    from hcqr_dspy.retrieval.fusion import STRATEGIES

    assert FUSION_STRATEGIES == STRATEGIES  # the method names: tests/programs/test_registry.py
    assert HYPOTHESIS_STYLES == tuple(signatures.HYPOTHESIS_STYLES)
    assert set(RETRIEVER_KINDS) == set(KINDS)


def test_help_and_version_import_nothing_heavy():
    """`hcqr --help` and `--version` answer without importing dspy, mlflow, torch, sentence-transformers or faiss
    (seconds of imports); the time itself is measured in the report, not here."""
    import subprocess
    import sys

    probe = (
        "import sys\nfrom hcqr_dspy.cli import main\n"
        "for argv in (['--help'], ['--version'], ['eval', '--help']):\n"
        "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
        "heavy = ('dspy', 'mlflow', 'torch', 'sentence_transformers', 'faiss', 'litellm', 'pandas')\n"
        "print('HEAVY', [m for m in heavy if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert "hcqr-dspy 0.1.0 (dspy " in out
    assert out.strip().splitlines()[-1] == "HEAVY []"


def test_every_option_says_its_default():
    from hcqr_dspy.cli.common import HelpFormatter
    from hcqr_dspy.cli.main import build_parser

    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    missing = []
    for name, sub in subparsers.choices.items():
        formatter = HelpFormatter(name)
        for action in sub._actions:
            if not action.option_strings or action.required or action.help == "show this help message and exit":
                continue
            if "default" not in formatter._expand_help(action).lower():
                missing.append(f"{name} {action.option_strings[0]}")
    assert missing == []


def test_hints_name_the_store_that_was_written(tmp_path, monkeypatch):
    import argparse

    from hcqr_dspy.cli.common import ui_hint

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("HCQR_MLFLOW_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    assert ui_hint(argparse.Namespace(mlflow_dir=None)) == "`hcqr ui`"
    assert ui_hint(argparse.Namespace(mlflow_dir="mlruns")) == "`hcqr ui`"
    other = tmp_path / "elsewhere"
    assert ui_hint(argparse.Namespace(mlflow_dir=str(other))) == f"`hcqr ui --mlflow-dir {other}`"
    from hcqr_dspy.tracking import store as tracking

    tracking.configure(other)  # MLflow now sets MLFLOW_TRACKING_URI to that store itself: still named by folder
    assert ui_hint(argparse.Namespace(mlflow_dir=str(other))) == f"`hcqr ui --mlflow-dir {other}`"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking.example:5000")
    assert ui_hint(argparse.Namespace(mlflow_dir=None)) == "the MLflow UI of http://tracking.example:5000"


def test_judge_refuses_a_run_without_contexts_or_with_an_index_of_another_corpus_before_any_lm(
    tmp_path, bm25_index, capsys
):
    from hcqr_dspy.evaluation.run_folder import RunFolder

    (tmp_path / "bench.json").write_text(
        json.dumps(
            {"d1": {"question": "Yellow vision?", "options": {"A": "Digoxin toxicity", "B": "Graves"}, "answer": "A"}}
        )
    )
    base = {"dataset": str(tmp_path / "bench.json"), "lm": {"spec": "local:no-such-model"}}  # never loaded
    cot = RunFolder.create(tmp_path / "cot", {**base, "method": "cot"})
    cot.predictions.append({"qid": "d1", "passages": []})
    code, err = error_of(capsys, ["judge", str(cot.path), "--index", str(bm25_index), "--no-mlflow"])
    assert code == 2 and err == [
        f"hcqr: error: {cot.path}: no question has a retrieved context (method cot): nothing to judge"
    ]
    rag = RunFolder.create(
        tmp_path / "rag",
        {**base, "method": "simple_rag", "index": {"path": str(bm25_index), "corpus_fingerprint": "f" * 64}},
    )
    rag.predictions.append({"qid": "d1", "passages": [{"id": "p3", "queries": [0]}]})
    code, err = error_of(capsys, ["judge", str(rag.path), "--no-mlflow"])
    assert code == 2 and len(err) == 1
    assert (
        err[0].startswith(f"hcqr: error: index {bm25_index} was built from another corpus") and "ffffffffffff" in err[0]
    )
    code, err = error_of(capsys, ["judge", str(rag.path), "--index", str(bm25_index), "--seed", "3", "--no-mlflow"])
    assert code == 2 and err == ["hcqr: error: --seed draws the --limit sample: give --limit N with it"]
    code, err = error_of(
        capsys, ["judge", str(rag.path), "--index", str(bm25_index), "--judge-lm", "gpt4", "--no-mlflow"]
    )
    assert code == 2 and len(err) == 1 and err[0].startswith("hcqr: error: unknown --judge-lm spec 'gpt4'")
    assert not (cot.path / "dur.json").exists() and not (rag.path / "dur.json").exists()


@pytest.mark.parametrize("command", [["prompts", "p.answer"], ["served"], ["ui", "--port", "1"]])
def test_store_commands_read_the_store_mlflow_tracking_uri_names(tmp_path, monkeypatch, capsys, command):
    """`hcqr prompts`, `served` and `ui` look for the store $MLFLOW_TRACKING_URI names (as `compare`, `register`
    and `eval` write to it), not for ./mlruns."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HCQR_MLFLOW_DIR", raising=False)
    uri = f"sqlite:///{tmp_path / 'elsewhere' / 'store.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    code, err = error_of(capsys, command)
    assert code == 2 and err[0].startswith(f"hcqr: error: no MLflow store at {uri} yet;")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "store.db").touch()  # a store file there: the check finds it and names it
    from hcqr_dspy.tracking.store import existing_store

    assert existing_store(None, "x") == uri and not (tmp_path / "mlruns").exists()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")  # a tracking server: left for MLflow to reach
    assert existing_store(None, "x") == "http://127.0.0.1:9"
