"""The score of every candidate or trial an optimizer measured, in the order it measured them, read from what it
attaches to the program it returns (source: ``dspy/teleprompt/*.py``, DSPy 3.4), as fractions in [0, 1] on the
scale of :func:`~hcqr_dspy.optimize.recipe_compile.optimizer_scores` (the catalog's ``score_scale``:
:mod:`hcqr_dspy.optimize.catalog`).

* MIPROv2: ``trial_logs`` (trial number, from 1: the zero-shot program's full evaluation) ``full_eval_score``, the
  score on the whole validation set, and ``mb_score``, the score on a mini-batch of it; both percentages.
* SIMBA: ``candidate_programs`` (best first), the programs it scored on every training question at the end, the
  mean metric a fraction; ``trial_logs[i]["train_score"]`` is the score of the ``i + 1``-th of them in the order it
  picked them (from its winning programs, in the order it found them), and the one left is the student's, which it
  picks first.
* BootstrapFewShotWithRandomSearch: ``candidate_programs`` (best first), each with the ``seed`` that made it
  (from -3: zero-shot, labelled demos only, unshuffled bootstrapping, then one shuffled bootstrapping per seed);
  the validation score, a percentage.
* GEPA (with ``track_stats``): ``detailed_results.val_aggregate_scores``, one per candidate in the order it was
  proposed (0: the student); fractions.
* BootstrapFewShot, LabeledFewShot: they score no candidate.
"""

from __future__ import annotations

from typing import Any

from hcqr_dspy.optimize.catalog import entry


def trial_scores(compiled: Any, optimizer: str) -> dict[str, list[tuple[int, float]]]:
    """Each series of scores ``optimizer`` measured while compiling, by the metric name it is logged under.

    Names: ``trial.val_score`` (MIPROv2's full evaluations, step the trial number) and ``trial.minibatch_score``
    (its mini-batch evaluations); ``candidate.val_score`` (random search, step ``seed + 3``; GEPA, step the
    candidate's index) or ``candidate.train_score`` (SIMBA, step the candidate's ``simba_idx``). Steps are
    integers >= 0, the order the optimizer measured them in; values fractions in [0, 1].

    Returns:
        ``{name: [(step, score), ...]}`` sorted by step; ``{}`` for an optimizer that scores no candidate or a
        program that carries no record of them.
    """
    e = entry(optimizer)
    if e.score_scale is None:
        return {}
    scale = e.score_scale
    out: dict[str, list[tuple[int, float]]] = {}
    if e.scores == "program_score":  # MIPROv2
        logs = getattr(compiled, "trial_logs", None) or {}
        for key, name in (("full_eval_score", "trial.val_score"), ("mb_score", "trial.minibatch_score")):
            points = [(int(n), float(t[key]) / scale) for n, t in logs.items() if _number(t.get(key))]
            if points:
                out[name] = sorted(points)
    elif e.scores == "candidate_programs":
        candidates = [c for c in getattr(compiled, "candidate_programs", None) or [] if isinstance(c, dict)]
        scores = [float(c["score"]) for c in candidates if _number(c.get("score"))]
        if e.scored_on == "trainset":  # SIMBA
            points = _simba_order(scores, getattr(compiled, "trial_logs", None) or {})
        else:  # random search: seeds from -3
            points = [(int(c["seed"]) + 3, float(c["score"])) for c in candidates if _number(c.get("seed"))]
        if points:
            out[f"candidate.{e.score_key}"] = sorted((step, score / scale) for step, score in points)
    elif e.scores == "gepa_results":
        results = getattr(compiled, "detailed_results", None)
        scores = getattr(results, "val_aggregate_scores", None) or []
        if scores:
            out["candidate.val_score"] = [(i, float(s) / scale) for i, s in enumerate(scores)]
    return out


def _simba_order(scores: list[float], logs: dict) -> list[tuple[int, float]]:
    """SIMBA's final scores in the order it picked the programs: the student's (step 0), then
    ``trial_logs[i]["train_score"]`` at step ``i + 1``; ``[]`` when the two records disagree."""
    later = [(int(i) + 1, float(t["train_score"])) for i, t in logs.items() if _number(t.get("train_score"))]
    left = list(scores)
    for _, score in later:
        if score not in left:
            return []
        left.remove(score)
    if len(left) != 1:
        return []
    return [(0, left[0]), *later]


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
