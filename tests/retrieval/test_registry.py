"""Retrievers are registered by kind and dense backends by name; no module imports its registry back."""

import ast
import json
from pathlib import Path

import pytest

from hcqr_dspy.errors import RetrievalIndexError
from hcqr_dspy.retrieval import Hit, Retriever, load_index, read_manifest, register, retriever_registry

REPO = Path(__file__).resolve().parents[2]


class SubstringRetriever(Retriever):
    """A real (if crude) retriever: passages containing the query's words, most words first."""

    def _search(self, queries, k):
        out = []
        for q in queries:
            words = q.lower().split()
            scored = [(sum(w in p.text.lower() for w in words), p.id) for p in self.corpus]
            out.append([Hit(pid, float(s)) for s, pid in sorted(scored, key=lambda t: (-t[0], t[1]))[:k] if s])
        return out

    def _write(self, folder):
        (folder / "substring.json").write_text("{}")

    @classmethod
    def _read(cls, folder, manifest, corpus, search_options=None, **_):
        return cls(corpus)


@pytest.fixture
def substring_kind():
    cls = register("substring")(SubstringRetriever)
    yield cls
    retriever_registry._RETRIEVERS.pop("substring")


def test_load_index_dispatches_on_the_manifest_kind(substring_kind, tiny_corpus, tmp_path):
    assert substring_kind.kind == "substring"
    assert retriever_registry.get_retriever_class("substring") is SubstringRetriever
    out = SubstringRetriever(tiny_corpus).save(tmp_path / "idx")
    assert read_manifest(out)["retriever"] == "substring"
    loaded = load_index(out)
    assert type(loaded) is SubstringRetriever and loaded.search(["digoxin vision"], 1)[0][0].passage_id == "p3"


def test_unknown_kind_or_backend_in_a_manifest_is_one_line(substring_kind, tiny_corpus, tmp_path):
    out = SubstringRetriever(tiny_corpus).save(tmp_path / "idx")
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps({**manifest, "retriever": "colbert"}))
    with pytest.raises(
        RetrievalIndexError,
        match=r"unknown retriever kind 'colbert'; known kinds: bm25, dense, hybrid, milvus, substring",
    ):
        load_index(out)
    with pytest.raises(
        RetrievalIndexError, match=r"unknown vector-index backend 'vespa'; known backends: faiss, milvus"
    ):
        retriever_registry.get_backend_class("vespa")
    with pytest.raises(ValueError, match="already registered"):
        register("bm25")(SubstringRetriever)


def imports_of(path: Path, package: str) -> set[str]:
    """Modules of ``package`` a file imports, at any level (function bodies included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(package):
            names = [f"{node.module}.{a.name}" for a in node.names]
            found.add(node.module)
            found.update(n for n in names if (REPO / (n.replace(".", "/") + ".py")).is_file())
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith(package))
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_no_import_cycle_among_retrieval_modules():
    folder = REPO / "hcqr_dspy" / "retrieval"
    graph = {}
    for f in folder.glob("*.py"):
        name = "hcqr_dspy.retrieval" if f.stem == "__init__" else f"hcqr_dspy.retrieval.{f.stem}"
        graph[name] = imports_of(f, "hcqr_dspy.retrieval") - {name}
    assert "hcqr_dspy.retrieval.index_kinds" not in graph["hcqr_dspy.retrieval.hybrid"]
    assert graph["hcqr_dspy.retrieval.retriever_registry"] == set()  # the registry imports no retriever or backend
    assert cycles(graph) == []


def test_no_import_cycle_among_bench_scripts():
    graph = {}
    for f in (REPO / "bench").glob("*.py"):
        tree = ast.parse(f.read_text(encoding="utf-8"))
        local = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        local |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        graph[f.stem] = {m for m in local if (REPO / "bench" / f"{m}.py").is_file()} - {f.stem}
    # report (with report_lm, report_serving and report_memory, its sections) is the leaf every script writes through
    assert graph["report"] == {"report_lm", "report_serving", "report_memory"}
    assert graph["report_lm"] == set() and graph["report_serving"] == set() and graph["report_memory"] == set()
    assert "retrieval" not in graph["pipeline"] and "pipeline" not in graph["retrieval"]
    assert cycles(graph) == []
