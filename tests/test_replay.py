"""Query replay (`hcqr replay`) and the query-diversity section of `hcqr compare`, on the demo data: DummyLM-made
runs over a demo BM25 index, replayed against a tiny dense index and against their own index."""

from __future__ import annotations

import json
import re
import shutil
from itertools import combinations
from pathlib import Path

import pytest

from hcqr_dspy.cli import main

DEMO = Path(__file__).resolve().parents[1] / "data" / "demo"
IDS = ["demo-001", "demo-002", "demo-003", "demo-004"]
# HCQR's rewritten queries per question (in IDS order), written so that the near-duplicate pairs
# (stemmed content-word sets with Jaccard >= 0.6) are known: 1, 1, 0 and 2 (one of them at exactly 3/5).
QUERIES = [
    [
        "digoxin inhibition of the myocyte Na+/K+-ATPase",
        "Na+/K+-ATPase inhibition by digoxin in myocytes",
        "yellow vision nausea atrial fibrillation",
    ],
    [
        "Borrelia burgdorferi erythema migrans",
        "tick-borne illness after camping with rash",
        "erythema migrans Borrelia burgdorferi tick",
    ],
    [
        "primary hyperaldosteronism hypokalemia",
        "pheochromocytoma episodic headaches",
        "resistant hypertension aldosterone renin ratio",
    ],
    [
        "serotonin syndrome cyproheptadine",
        "serotonin syndrome treatment cyproheptadine",
        "cyproheptadine serotonin syndrome tramadol sertraline",
    ],
]
PAIRS = [1, 1, 0, 2]
ANSWER = {"reasoning": "r", "answer": "A"}


def hcqr_lm():
    """A DummyLM scripted per question, in run order: hypothesis, rewrite (:data:`QUERIES`), answer."""
    import dspy
    from dspy.utils import DummyLM

    hypothesis = {
        "discriminating_features": "key finding",
        "reasoning": "r",
        "working_hypothesis": "A",
        "confirming_evidence": "typical presentation",
    }
    replies = []
    for q1, q2, q3 in QUERIES:
        replies += [hypothesis, {"support_query": q1, "distinction_query": q2, "key_feature_query": q3}, ANSWER]
    return DummyLM(replies, adapter=dspy.JSONAdapter())


def answer_lm():
    """A DummyLM that answers every answer step with A."""
    import dspy
    from dspy.utils import DummyLM

    return DummyLM({"`answer`": ANSWER}, adapter=dspy.JSONAdapter())


def rewrite_lm():
    """A DummyLM for the generic rewriter: per question, its queries (:data:`QUERIES`), then the answer."""
    import dspy
    from dspy.utils import DummyLM

    return DummyLM([reply for qs in QUERIES for reply in ({"queries": qs}, ANSWER)], adapter=dspy.JSONAdapter())


def evaluate(folder: Path, method: str, index: Path, lm, **options) -> Path:
    from hcqr_dspy.workflows.evaluate import run_evaluation
    from hcqr_dspy.workflows.specs import EvalSpec

    spec = EvalSpec(
        method=method,
        dataset=str(DEMO / "questions.json"),
        index=str(index),
        lm="dummy/x",
        ids=IDS,
        run_dir=str(folder),
        program_options=options,
    )
    return run_evaluation(spec, progress=False, track=False, lm=lm)[1]


def tiny_bert(folder: Path) -> Path:
    """A 1-layer BERT with random weights (seeded) over the demo corpus's and the queries' words: a dense
    encoder built here, nothing downloaded (sentence-transformers pools and normalizes it)."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizer

    text = (DEMO / "corpus.jsonl").read_text(encoding="utf-8") + json.dumps(QUERIES)
    words = sorted(set(re.findall(r"[a-z0-9]+", text.lower())))
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, *".,;:-+/()'\"%"]
    folder.mkdir(parents=True)
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    BertTokenizer(str(folder / "vocab.txt"), do_lower_case=True).save_pretrained(str(folder))
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
    )
    BertModel(config).eval().save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo BM25 index, a tiny dense index of the same corpus, an index of another corpus, and four
    DummyLM-made runs over the BM25 index (HCQR, Simple RAG, CoT, the generic rewriter with reciprocal rank
    fusion) on four demo questions."""
    from helpers import TINY_ROWS, snippet, write_jsonl

    from hcqr_dspy.retrieval import BM25Retriever, DenseRetriever, load_corpus

    root = tmp_path_factory.mktemp("replay")
    corpus = load_corpus(DEMO / "corpus.jsonl")
    bm25 = BM25Retriever(corpus, show_progress=False).save(root / "bm25")
    dense = DenseRetriever(corpus, encoder=str(tiny_bert(root / "bert")), show_progress=False).save(root / "dense")
    other = load_corpus(write_jsonl(root / "tiny.jsonl", [snippet(*r) for r in TINY_ROWS]))
    foreign = BM25Retriever(other, show_progress=False).save(root / "foreign")
    runs = {
        "hcqr": evaluate(root / "hcqr", "hcqr", bm25, hcqr_lm()),
        "simple_rag": evaluate(root / "simple_rag", "simple_rag", bm25, answer_lm()),
        "cot": evaluate(root / "cot", "cot", bm25, answer_lm()),
        "query_rewrite": evaluate(root / "query_rewrite", "query_rewrite", bm25, rewrite_lm(), fusion="rrf"),
    }
    return {"root": root, "bm25": bm25, "dense": dense, "foreign": foreign, **runs}


def rows(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "predictions.jsonl").read_text().splitlines()]


def direct(index: Path, folder: Path, k: int, budget: int = 15, strategy: str = "score_sum") -> dict:
    """The figures replay must give, computed here from the rows with the retriever, fusion and evidence measure
    themselves: each row's queries searched (``k`` each), fused (``strategy``), documents as the answer step
    shows them, gold option mentioned or not; near-duplicate pairs and words per query from the queries."""
    from hcqr_dspy.evaluation.evidence import content_stems, question_evidence
    from hcqr_dspy.programs.context import format_document
    from hcqr_dspy.retrieval import load_index
    from hcqr_dspy.retrieval.fusion import fuse

    retriever = load_index(index)
    questions = json.loads((DEMO / "questions.json").read_text())
    contexts, gold, pairs = {}, [], []
    for row in rows(folder):
        ids = [f.passage_id for f in fuse(retriever.search(row["queries"], k=k), budget=budget, strategy=strategy)]
        contexts[row["qid"]] = ids
        docs = [format_document(i, retriever.get(p).title, retriever.get(p).content) for i, p in enumerate(ids, 1)]
        q = questions[row["qid"]]
        gold.append(question_evidence(q["options"], q["answer"], docs)["gold_mentioned"])
        stems = [content_stems(x) for x in row["queries"]]
        pairs.append(sum(len(a & b) / len(a | b) >= 0.6 for a, b in combinations(stems, 2)))
    queries = [x for row in rows(folder) for x in row["queries"]]
    return {
        "contexts": contexts,
        "gold_coverage": sum(gold) / len(gold),
        "distinct": sum(len(set(c)) for c in contexts.values()) / len(contexts),
        "pairs": pairs,
        "words": sum(len(x.split()) for x in queries) / len(queries),
    }


def test_replay_against_a_dense_index_gives_what_searching_the_rows_queries_there_gives(demo, tmp_path):
    from hcqr_dspy.cli import replay_command as command
    from hcqr_dspy.evaluation.evidence import evidence_summary
    from hcqr_dspy.reporting.query_diversity import NEAR_DUPLICATE_JACCARD
    from hcqr_dspy.workflows.replay import replay

    assert command.NEAR_DUPLICATE_JACCARD == NEAR_DUPLICATE_JACCARD == 0.6  # the flag's default is the measure's

    planned = [demo["hcqr"], demo["simple_rag"], demo["query_rewrite"]]
    report, summary, files = replay(planned, demo["dense"], out_dir=tmp_path / "out")
    assert [f.name for f in files] == ["replay.md", "replay.json"]
    assert json.loads((tmp_path / "out" / "replay.json").read_text()) == summary
    assert (tmp_path / "out" / "replay.md").read_text() == report
    assert summary["index"]["retriever"] == "dense" and summary["index"]["count"] == 229
    for label, k, fusion in (("hcqr", 5, "score_sum"), ("simple_rag", 15, "score_sum"), ("query_rewrite", 5, "rrf")):
        run, want = summary["runs"][label], direct(demo["dense"], demo[label], k, strategy=fusion)
        assert run["fusion"] == fusion
        replayed = {p["qid"]: p["replayed"] for p in run["per_question"]}
        recorded = {r["qid"]: [p["id"] for p in r["passages"]] for r in rows(demo[label])}
        assert replayed == want["contexts"]
        assert replayed != recorded  # another index: the replay searched, it did not copy the run's contexts
        assert run["replayed"]["gold_coverage"] == pytest.approx(want["gold_coverage"])
        assert run["replayed"]["distinct_passages"] == pytest.approx(want["distinct"])
        # the recorded side agrees with the evidence `hcqr eval` wrote into each row
        assert run["recorded"]["gold_coverage"] == pytest.approx(evidence_summary(rows(demo[label]))["gold_coverage"])
        assert run["queries"]["words_per_query"] == pytest.approx(want["words"])
        assert run["shared_passages"] == pytest.approx(
            sum(len(set(recorded[q]) & set(replayed[q])) for q in IDS) / len(IDS)
        )
    assert direct(demo["dense"], demo["hcqr"], 5)["pairs"] == PAIRS
    for label in ("hcqr", "query_rewrite"):
        assert [p["queries"] for p in summary["runs"][label]["per_question"]] == QUERIES
    hcqr = summary["runs"]["hcqr"]["queries"]
    assert (hcqr["near_duplicate_pairs"], hcqr["with_near_duplicate"], hcqr["queries_per_question"]) == (1.0, 0.75, 3)
    assert summary["runs"]["simple_rag"]["queries"]["near_duplicate_pairs"] == 0
    assert f"| hcqr | 4 | 3.00 | 1.00 | 75.0% | {hcqr['words_per_query']:.1f} |" in report


def test_replay_against_the_runs_own_index_rebuilds_its_contexts_and_budget_overrides(demo, tmp_path, capsys):
    from hcqr_dspy.workflows.replay import replay

    _, summary, _ = replay([demo["hcqr"], demo["simple_rag"], demo["query_rewrite"]], demo["bm25"])
    for run in summary["runs"].values():
        assert all(p["recorded"] == p["replayed"] for p in run["per_question"])
        assert run["recorded"] == run["replayed"]
        assert (run["coverage_test"]["gold_b"], run["coverage_test"]["gold_c"]) == (0, 0)
    # the run's recorded settings are the replay's: passages per query and fusion read from config.json
    edited = shutil.copytree(demo["hcqr"], tmp_path / "edited")
    config = json.loads((edited / "config.json").read_text())
    config["program"].update(k_per_query=7, fusion="rrf")
    (edited / "config.json").write_text(json.dumps(config))
    run = replay([edited], demo["bm25"])[1]["runs"]["hcqr"]
    want = direct(demo["bm25"], demo["hcqr"], k=7, strategy="rrf")["contexts"]
    assert {p["qid"]: p["replayed"] for p in run["per_question"]} == want
    # --budget 5: HCQR searches ceil(5 / 3) = 2 passages per query and keeps 5
    assert (
        main(["replay", str(demo["hcqr"]), "--index", str(demo["bm25"]), "--budget", "5", "--out", str(tmp_path)]) == 0
    )
    assert capsys.readouterr().out.startswith("written: ")
    run = json.loads((tmp_path / "replay.json").read_text())["runs"]["hcqr"]
    want = direct(demo["bm25"], demo["hcqr"], k=2, budget=5)["contexts"]
    assert {p["qid"]: p["replayed"] for p in run["per_question"]} == want
    assert (run["budget"], run["run_budget"]) == (5, 15) and "| 5 (run: 15) |" in (tmp_path / "replay.md").read_text()
    # without --out the report goes to stdout
    assert main(["replay", str(demo["simple_rag"]), "--index", str(demo["bm25"])]) == 0
    assert capsys.readouterr().out.startswith("# Query replay against")


def errors(capsys) -> list[str]:
    lines = capsys.readouterr().err.strip().splitlines()
    assert all(line.startswith("hcqr: error: ") for line in lines), lines
    return lines


def test_bad_input_is_refused_one_line_per_fault(demo, tmp_path, capsys):
    cot, hcqr = str(demo["cot"]), str(demo["hcqr"])
    assert main(["replay", cot, "--index", str(demo["bm25"])]) == 2
    (line,) = errors(capsys)
    assert line.endswith(f"{cot}: method cot records no search queries: nothing to replay")
    assert main(["replay", hcqr, "--index", str(demo["foreign"])]) == 2
    (line,) = errors(capsys)
    assert (
        f"index {demo['foreign']} holds another corpus" in line
        and "replay needs an index over the run's corpus" in line
    )
    missing = tmp_path / "nowhere"
    assert main(["replay", cot, str(missing), hcqr, "--index", str(demo["foreign"])]) == 2
    lines = errors(capsys)
    assert len(lines) == 3 and "nothing to replay" in lines[0] and "does not exist" in lines[1]
    assert main(["replay", hcqr, "--index", str(missing)]) == 2
    (line,) = errors(capsys)
    assert "does not exist" in line
    # a run that recorded no corpus fingerprint: refused by the passages it showed that the index lacks
    bare = shutil.copytree(demo["hcqr"], tmp_path / "bare")
    config = json.loads((bare / "config.json").read_text())
    del config["index"]["corpus_fingerprint"]
    (bare / "config.json").write_text(json.dumps(config))
    assert main(["replay", str(bare), "--index", str(demo["foreign"])]) == 2
    (line,) = errors(capsys)
    assert f"index {demo['foreign']} lacks" in line and "passage(s) run" in line
    # the index itself as --out: refused before anything is written into it
    assert main(["replay", hcqr, "--index", str(demo["bm25"]), "--out", str(demo["bm25"])]) == 2
    (line,) = errors(capsys)
    assert "is an index folder (it holds manifest.json" in line
    assert line.endswith("written by `hcqr index`); write the replay to a folder of its own")
    assert not list(Path(demo["bm25"]).glob("*.md"))


def test_compare_shows_query_diversity_for_query_planning_runs_only(demo, tmp_path):
    from hcqr_dspy.reporting import compare

    runs = [demo["simple_rag"], demo["cot"], demo["hcqr"]]
    report, _ = compare(runs, reference="simple_rag", out_dir=tmp_path / "out")
    section = report.split("## Query diversity")[1].split("\n## ")[0]
    hcqr_distinct = sum(len({p["id"] for p in r["passages"]}) for r in rows(demo["hcqr"])) / 4
    words = direct(demo["bm25"], demo["hcqr"], 5)["words"]
    assert f"| hcqr | 4 | 3.00 | 1.00 | 75.0% | {hcqr_distinct:.1f} of 15 | {words:.1f} |" in section
    assert "| simple_rag | 4 | 1.00 | 0.00 | 0.0% | 15.0 of 15 |" in section and "| cot |" not in section
    figures = json.loads((tmp_path / "out" / "comparison.json").read_text())["query_diversity"]
    assert set(figures) == {"simple_rag", "hcqr"} and figures["hcqr"]["near_duplicate_pairs"] == 1.0
    twin = shutil.copytree(demo["cot"], tmp_path / "cot_again")
    report, _ = compare([demo["cot"], twin], out_dir=tmp_path / "cot_only")
    assert "## Query diversity" not in report
