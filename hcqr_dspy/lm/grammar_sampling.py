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

When the greedy token is refused (a small model writing a raw line break inside a JSON string does so at every
line), the grammar is first matched against the ``top_k`` highest-scoring tokens only: if the best of those it
allows scores strictly above every token outside them, it is the highest-scoring allowed token of the whole
vocabulary (ties within them go to the lowest id, as the full pass's argmax does); otherwise the full pass decides
(docs/install.md and ``bench/lm_overhead.py`` have the cost of each and the effect on whole calls).
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

TOP_K = 512  # tokens matched first when the greedy token is refused (see the module docstring)


class GrammarLastGreedy:
    """Greedy sampling under a GBNF grammar, the grammar checked on the greedy token first.

    Ties go to the lowest token id, as in llama.cpp's greedy sampler (a strict ``>`` scan) and ``numpy.argmax``.
    The candidates are in token-id order as ``llama_sampler_sample`` builds them, so the token equals the chain's.

    Args:
        llm: The ``llama_cpp.Llama`` generating.
        grammar: Its ``LlamaGrammar`` (GBNF text and root rule).
        penalty_last_n, repeat_penalty, frequency_penalty, presence_penalty: llama.cpp's penalties sampler, as
            llama-cpp-python's chain sets it (applied before the grammar, as there).
        top_k: Tokens the grammar is matched against first when the greedy token is refused (0: the full pass
            at once).
    """

    def __init__(
        self,
        llm: Any,
        grammar: Any,
        penalty_last_n: int,
        repeat_penalty: float,
        frequency_penalty: float,
        presence_penalty: float,
        top_k: int = TOP_K,
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
        self.top_k = max(0, min(top_k, self.n_vocab - 1))
        self._top = (llama_cpp.llama_token_data * max(self.top_k, 1))()
        self._top_view = np.frombuffer(self._top, dtype=self._view.dtype)
        self.grammar_passes = 0  # full-vocabulary grammar passes (the greedy token was refused, top_k did not decide)
        self.top_k_passes = 0  # refusals decided among the top_k tokens
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
        if self._one[0].logit == -np.inf:  # refused: the best token the grammar allows decides
            token = self.best_allowed()
        self.tokens += 1
        lib.llama_sampler_accept(self.penalties, token)
        lib.llama_sampler_accept(self.grammar, token)
        return token

    def best_allowed(self) -> int:
        """The highest-scoring token the grammar allows over the (penalised) logits in the buffer, lowest id on
        ties: decided among the ``top_k`` best when that is exact (see the module docstring), else by the full pass."""
        lib, view, k = self._lib, self._view, self.top_k
        if k:
            logit = np.ascontiguousarray(view["logit"])
            part = np.argpartition(logit, self.n_vocab - k - 1)[self.n_vocab - k - 1 :]  # the k + 1 best, unordered
            order = part[np.lexsort((part, -logit[part]))]  # best first, lowest id first on ties
            top = self._top_view
            top["id"], top["logit"], top["p"] = order[:k], logit[order[:k]], 0.0
            lib.llama_sampler_apply(self.grammar, ctypes.byref(self._array(self._top, k)))
            allowed = np.flatnonzero(top["logit"] != -np.inf)
            if allowed.size and top["logit"][allowed[0]] > logit[order[k]]:
                self.top_k_passes += 1
                return int(top["id"][allowed[0]])
        self.grammar_passes += 1
        lib.llama_sampler_apply(self.grammar, ctypes.byref(self._array(self._data, self.n_vocab)))
        return int(np.argmax(view["logit"]))

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
