"""Grammar-constrained greedy decoding that checks the grammar against one token, not the whole vocabulary.

llama-cpp-python (0.3.x) samples a grammar-constrained reply with a sampler chain of penalties, the grammar
and greedy: the grammar sampler matches every vocabulary entry (151,936 for Qwen2.5) against the grammar's
stacks at every generated token, a cost of the order of the decode itself (docs/install.md has the figures).
llama.cpp's own ``common_sampler_sample`` (``common/sampling.cpp``, with
``grammar_first`` false) samples first without the grammar and applies it to the full candidates only when the
token drawn is one the grammar rejects. For greedy decoding this gives the same token: if the highest-scoring
token is allowed, it is also the highest-scoring allowed token; if it is not, the full grammar pass decides as
before. :class:`GrammarLastGreedy` does this with llama.cpp's sampler API (``llama_sampler_apply`` /
``llama_sampler_accept``), and :func:`install` puts it in place of the chain for greedy, grammar-constrained
generation only (sampling at a temperature, mirostat or a logits processor keep llama-cpp-python's chain).
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np


class GrammarLastGreedy:
    """Greedy sampling under a GBNF grammar, the grammar checked on the greedy token first.

    Ties go to the lowest token id, as in llama.cpp's greedy sampler (a strict ``>`` scan) and ``numpy.argmax``.
    The candidates are in token-id order as ``llama_sampler_sample`` builds them, so the token equals the chain's.

    Args:
        llm: The ``llama_cpp.Llama`` generating.
        grammar: Its ``LlamaGrammar`` (GBNF text and root rule).
        penalty_last_n, repeat_penalty, frequency_penalty, presence_penalty: llama.cpp's penalties sampler, as
            llama-cpp-python's chain sets it (applied before the grammar, as there).
    """

    def __init__(
        self,
        llm: Any,
        grammar: Any,
        penalty_last_n: int,
        repeat_penalty: float,
        frequency_penalty: float,
        presence_penalty: float,
    ):
        import llama_cpp

        self._lib = llama_cpp
        self.n_vocab = llm.n_vocab()
        vocab = llm._model.vocab
        self.grammar = llama_cpp.llama_sampler_init_grammar(
            vocab, grammar._grammar.encode("utf-8"), grammar._root.encode("utf-8")
        )
        if not self.grammar:
            raise ValueError("llama.cpp refused the grammar")
        self.penalties = llama_cpp.llama_sampler_init_penalties(
            self.n_vocab, penalty_last_n, repeat_penalty, frequency_penalty, presence_penalty
        )
        # one buffer of llama_token_data (id, logit, p) for the whole vocabulary, and one for a single token; the
        # ids are written once: the penalties and the grammar change logits only, never the order
        self._data = (llama_cpp.llama_token_data * self.n_vocab)()
        self._view = np.frombuffer(
            self._data, dtype=np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])
        )
        self._view["id"] = np.arange(self.n_vocab, dtype=np.int32)
        self._one = (llama_cpp.llama_token_data * 1)()
        self.grammar_passes = 0  # full-vocabulary grammar passes (the greedy token was rejected)
        self.tokens = 0

    def _array(self, data, size: int):
        return self._lib.llama_token_data_array(
            data=ctypes.cast(data, self._lib.llama_token_data_p), size=size, selected=-1, sorted=False
        )

    def sample(self, ctx: Any, idx: int = -1) -> int:
        """The next token (the greedy token the grammar allows) from the logits at ``idx``; both samplers accept it."""
        lib = self._lib
        logits = lib.llama_get_logits_ith(ctx.ctx, idx)
        view = self._view
        view["logit"] = np.ctypeslib.as_array(logits, shape=(self.n_vocab,))
        full = self._array(self._data, self.n_vocab)
        lib.llama_sampler_apply(self.penalties, ctypes.byref(full))
        token = int(np.argmax(view["logit"]))
        self._one[0].id, self._one[0].logit, self._one[0].p = token, float(view["logit"][token]), 0.0
        one = self._array(self._one, 1)
        lib.llama_sampler_apply(self.grammar, ctypes.byref(one))
        if self._one[0].logit == -np.inf:  # rejected: the grammar pass over every candidate decides
            self.grammar_passes += 1
            lib.llama_sampler_apply(self.grammar, ctypes.byref(full))
            token = int(np.argmax(view["logit"]))
        self.tokens += 1
        lib.llama_sampler_accept(self.penalties, token)
        lib.llama_sampler_accept(self.grammar, token)
        return token

    def close(self) -> None:
        for s in ("grammar", "penalties"):
            if getattr(self, s, None):
                self._lib.llama_sampler_free(getattr(self, s))
                setattr(self, s, None)

    def __del__(self) -> None:
        self.close()


def install(llm: Any) -> None:
    """Let ``llm`` (a ``llama_cpp.Llama``) use :class:`GrammarLastGreedy` for greedy, grammar-constrained generation.

    Wraps the instance's ``_init_sampler`` (called once per ``generate``); every other case gets the chain
    llama-cpp-python builds.
    """
    chain = llm._init_sampler

    def init_sampler(**kw):
        plain = (
            kw.get("grammar") is not None
            and kw.get("temp", 0.8) == 0.0
            and kw.get("logits_processor") is None
            and kw.get("mirostat_mode", 0) == 0
        )
        if not plain:
            return chain(**kw)
        return GrammarLastGreedy(
            llm,
            kw["grammar"],
            penalty_last_n=llm.last_n_tokens_size,
            repeat_penalty=kw.get("repeat_penalty", 1.0),
            frequency_penalty=kw.get("frequency_penalty", 0.0),
            presence_penalty=kw.get("presence_penalty", 0.0),
        )

    llm._init_sampler = init_sampler
