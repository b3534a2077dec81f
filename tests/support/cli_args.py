"""Command lines the tests give `hcqr` (``main(argv)`` in this process, or ``python -m hcqr_dspy.cli``), built in
one place so that each test names only what it varies."""

from __future__ import annotations

from pathlib import Path


def stub_args(stub) -> list[str]:
    """The flags that point a command at the stub OpenAI-compatible server of stub_server.py (key in $STUB_KEY)."""
    return ["--lm", "openai/stub-model", "--api-base", stub.base, "--api-key-env", "STUB_KEY"]


def server_args(prefix: str, server, key_env: str | None = None) -> list[str]:
    """The flags that point a command at a real OpenAI-compatible server (support/llama_server.py) under the
    provider prefix ``prefix`` (``hosted_vllm``, ``openai``), with the key variable ``key_env`` if given."""
    key = ["--api-key-env", key_env] if key_env else []
    return ["--lm", f"{prefix}/{server.alias}", "--api-base", server.base, *key]


def eval_argv(bench: Path, run_dir: Path, *extra: str, method: str = "cot") -> list[str]:
    """`hcqr eval` of ``method`` on the bench's ``qs.json`` into ``run_dir``, then ``extra``."""
    return ["eval", "--method", method, "--dataset", str(bench / "qs.json"), "--run-dir", str(run_dir), *extra]


def index_argv(corpus: Path, out: Path, *extra: str) -> list[str]:
    """`hcqr index` of the corpus file ``corpus`` into the folder ``out``, with ``extra`` between."""
    return ["index", "--corpus", str(corpus), *extra, "--out", str(out)]


def milvus_index_argv(corpus: Path, uri: str | Path, collection: str, out: Path, *extra: str) -> list[str]:
    """`hcqr index --backend milvus` of ``corpus`` into the collection ``collection`` at ``uri``."""
    return index_argv(corpus, out, "--backend", "milvus", "--milvus-uri", str(uri), "--collection", collection, *extra)
