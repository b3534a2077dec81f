"""hcqr against a real OpenAI-compatible server: llama-cpp-python's own (tests/support/llama_server.py), serving the
smallest packaged model on 127.0.0.1, reached under the prefixes users give vLLM and generic endpoints
(``hosted_vllm/``, ``openai/`` with ``--api-base``), one and several questions in flight.

What must come through: the output schema (HCQR_RESPONSE_FORMAT=json_object, the dialect llama-cpp-python's
server takes; hcqr_dspy/lm/adapter.py), token usage in every row, a reply cut at max_tokens counted as an invalid
cause, and at temperature 0 the very replies of hcqr's in-process engine on the same model and prompts: the
server runs the same ``Llama`` class with the same chat template, sampler and settings.

A prompt's arithmetic depends on what the engine computed before it: llama.cpp resumes from the KV cache of the
longest prefix it holds (the previous prompt's, or a state the prompt cache kept) and computes only the rest, in
other batches, and a near-tie can then break the other way. So the exact comparisons run both engines over the same
history: the prompt cache off on both (``HCQR_PROMPT_CACHE_MB=0``: each resumes only from its previous prompt), the
in-process engine this folder's own (its window ``N_CTX`` keys it apart from other tests' engines), each
sent :data:`PROBE` first (the question ``check_lm`` asks a remote LM before a run), and one question in flight.
With several in flight the server's order differs from a sequential run's: those runs are held to what does not
depend on it. SmolLM2-135M cannot answer medical questions; agreement, not accuracy, is asserted.
"""

import pytest
from support.llama_server import LocalLlamaServer, running_or_skip
from support.openai_server import DEMO, KEY_VARIABLE, N_CTX

from hcqr_dspy.cli import main
from hcqr_dspy.lm import build_lm
from hcqr_dspy.lm.adapter import RESPONSE_FORMAT_VARIABLE


@pytest.fixture(scope="module")
def server():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(RESPONSE_FORMAT_VARIABLE, "json_object")
        mp.setenv(KEY_VARIABLE, "sk-local-test")
        mp.setenv("HCQR_PROMPT_CACHE_MB", "0")  # read by the server's command line and the engine made below
        mp.setenv("HCQR_N_THREADS", "1")  # flash attention's sums depend on the thread count: equal on both sides
        # without flash attention, as these tests were first run: with it on, the openai/ predict test's first
        # request (check_lm's 5-token probe) got no reply within its 60 s timeout, a cause not yet traced
        mp.setenv("HCQR_FLASH_ATTN", "0")
        srv = LocalLlamaServer(n_ctx=N_CTX)
        with running_or_skip(srv):
            yield srv


@pytest.fixture(scope="module")
def local_lm(server):
    """The in-process LM on this folder's own engine (its window ``N_CTX``; made now, with the prompt cache off)."""
    lm = build_lm("local:smollm2-135m", n_ctx=N_CTX, cache=False)
    assert lm.engine.settings.prompt_cache_mb == 0
    return lm


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo questions and a BM25 index of the demo corpus."""
    root = tmp_path_factory.mktemp("openai-server")
    assert (
        main(["index", "--corpus", str(DEMO / "corpus.jsonl"), "--retriever", "bm25", "--out", str(root / "idx")]) == 0
    )
    return root
