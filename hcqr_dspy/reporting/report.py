"""The comparison report: :func:`compare` loads runs over the same questions, assembles the report's
sections, and writes ``comparison.md``, ``comparison.json`` and the plots."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hcqr_dspy.errors import HCQRError
from hcqr_dspy.evaluation.evidence import qrels_beside
from hcqr_dspy.evaluation.folders import out_folder_fault, repeated_folder
from hcqr_dspy.evaluation.metrics import fallback_summary
from hcqr_dspy.evaluation.same_questions import check_same_questions
from hcqr_dspy.programs import PROGRAMS
from hcqr_dspy.reporting.arm_contrasts import ARMS_NOTE, arm_contrasts
from hcqr_dspy.reporting.compiled import COMPILED_NOTE, GAIN_NOTE, compiled_table, gain_against_gain
from hcqr_dspy.reporting.diagnostics import dur_sample_warning, fallback_table, invalid_table
from hcqr_dspy.reporting.equivalence import EQUIVALENCE_NOTE, check_margins, equivalence_table
from hcqr_dspy.reporting.evidence_tables import evidence_table, qrels_table
from hcqr_dspy.reporting.family import SEED_OF_ARM, collecting, seeds_tested_as_arms, tested_alone
from hcqr_dspy.reporting.gold_probability import (
    GOLD_PROBABILITY_NOTE,
    baselines_and_letters,
    calibration_table,
    gold_probability_table,
)
from hcqr_dspy.reporting.hypotheses import hypothesis_table, hypothesis_vs_cot, upstream_agreement
from hcqr_dspy.reporting.judge_tables import (
    MLFLOW_JUDGES_NOTE,
    controls_note,
    judge_controls_table,
    mlflow_judges_table,
)
from hcqr_dspy.reporting.planning import PLANNING_NOTE, planning_table
from hcqr_dspy.reporting.plots import PLOTS
from hcqr_dspy.reporting.program_diff import program_diff
from hcqr_dspy.reporting.query_diversity import QUERY_DIVERSITY_NOTE, query_diversity_section
from hcqr_dspy.reporting.replicates import REPLICATES_NOTE, check_groups, pooled_arms, replicates_table
from hcqr_dspy.reporting.runs import (
    Run,
    check_same_gold,
    load_run,
    provenance_line,
    restrict,
    run_label,
    session_summary,
    unique_labels,
)
from hcqr_dspy.reporting.saved_programs import ProgramFolders
from hcqr_dspy.reporting.setups import NOTE as SETUPS_NOTE
from hcqr_dspy.reporting.setups import SetupCheck, setup_check
from hcqr_dspy.reporting.stats import mcnemar_exact
from hcqr_dspy.reporting.tables import (
    cache_note,
    comparison_table,
    contention_note,
    disagreements,
    stage_differences,
)

# The notes under the report's tables.
MCNEMAR_NOTE = (
    "b = questions the reference got right and this run wrong; c = the reverse; exact McNemar test "
    "(statsmodels) on b vs c."
)
SEED_OF_ARM_NOTE = (
    f"{SEED_OF_ARM}: one compile seed of an optimizer arm of two or more seeds; the arm is tested pooled over its "
    "seeds (Replicate compiles; Optimizer arm against optimizer arm), not each seed apart, so the family holds one "
    "test per arm and outcome."
)
FALLBACKS_NOTE = (
    "A fallback is what a method did instead of its own path (e.g. HCQR queries built from the "
    "hypothesis fields because the rewrite gave fewer than two usable queries, or the question itself "
    "when the hypothesis reply could not be parsed); a run that took one mostly is flagged above."
)
EVIDENCE_NOTE = (
    "gold coverage = share of questions whose shown context has a passage holding every stemmed content "
    "word of the gold option; distractor coverage = mean share of distractors so mentioned; margin = the "
    "difference. Paired tests against the reference: exact McNemar on gold mentions, Wilcoxon signed-rank "
    "on per-question margins."
)
HYPOTHESIS_VS_COT_NOTE = (
    "b = questions CoT answered right and the hypothesis got wrong; c = the reverse; exact "
    "McNemar test. A hypothesis reply that could not be parsed counts wrong."
)
HYPOTHESIS_NOTE = (
    "fixed = a wrong hypothesis turned into a right answer; broke = a right hypothesis turned into a wrong answer."
)
AGREEMENT_NOTE = (
    "On the questions both runs answered with a working hypothesis: how often they formed the same "
    "hypothesis letter, rewrote it into the same queries and showed the same passages. Where these "
    "differ, a difference between the runs is not only that of their programs' answer steps (an LM can "
    "give another reply to the same prompt, e.g. in another session)."
)


def _section(title: str, body: str | None, note: str = "") -> list[str]:
    """The report section ``## title`` with its body and the note under it; none when the body is empty."""
    if not body:
        return []
    return [f"## {title}\n\n{body}" + (f"\n\n{note}" if note else "")]


def _checked_out(run_dirs: Sequence[str | Path], out_dir: str | Path | None) -> Path:
    """The ``--out`` folder, after checking there are two distinct runs and that ``out_dir`` can hold the report.

    Raises:
        HCQRError: fewer than two runs, the same folder twice, or an ``out_dir`` that is a file, a run folder or an
            index folder.
    """
    if len(run_dirs) < 2:
        raise HCQRError("compare needs at least two run folders")
    seen: dict[Path, str] = {}
    for p in run_dirs:
        twice = repeated_folder(p, seen)
        if twice:
            raise HCQRError(f"{twice}; compare distinct runs")
    out = Path(out_dir or "comparison")
    fault = out_folder_fault(out, "comparison")
    if fault:
        raise HCQRError(fault)
    return out


def _reference(runs: Sequence[Run], reference: str | None) -> Run:
    """The run ``reference`` names (its label, method, folder or folder name); the first run when ``None``.

    Raises:
        HCQRError: it names no run, or several.
    """
    if not reference:
        return runs[0]
    by_label = [r for r in runs if r.label == reference]
    if len(by_label) == 1:  # a run's exact label names it, even where a compiled run shares its method
        return by_label[0]
    matches = [
        r
        for r in runs
        if reference in (r.label, run_label(r.config, r.path), r.config.get("method"), str(r.path), r.path.name)
        or Path(reference).resolve() == r.path.resolve()
    ]
    if not matches:
        raise HCQRError(f"reference {reference!r} is none of: {', '.join(r.label for r in runs)}")
    if len(matches) > 1:
        raise HCQRError(
            f"reference {reference!r} matches {len(matches)} runs ({', '.join(r.label for r in matches)}); "
            "give the reference run's exact label or its folder's path"
        )
    return matches[0]


def _write_plots(runs: Sequence[Run], out: Path) -> list[Path]:
    """Write the :data:`~hcqr_dspy.reporting.plots.PLOTS` that apply to ``out``, removing those an earlier
    comparison in this folder left and this one lacks; returns the written files."""
    files = []
    for name, plot in PLOTS.items():
        if (written := plot(runs, out / name)) is not None:
            files.append(written)
        else:  # a plot of an earlier comparison in this folder that this one lacks
            (out / name).unlink(missing_ok=True)
    return files


def _heading(ref: Run, qids: Sequence[str], answered: dict[str, int], common: bool) -> str:
    """The report's title, and with ``common`` on runs under way how many questions each has answered."""
    head = f"# Comparison on {len(qids)} questions (reference: {ref.label})"
    if common and len(set(answered.values()) | {len(qids)}) > 1:
        head += (
            f"\n\nRuns under way, compared on the {len(qids)} questions every run has answered of the "
            f"{ref.folder.questions_record.get('count', '?')} selected (answered so far: "
            + ", ".join(f"{label} {n}" for label, n in answered.items())
            + ")."
        )
    return head


def _report(
    ordered: Sequence[Run],
    qids: Sequence[str],
    answered: dict[str, int],
    common: bool,
    qrels_path: Path | None,
    explicit: bool,
    margins: dict[str, float] | None = None,
    setups: SetupCheck | None = None,
    groups: dict[str, list[str]] | None = None,
) -> tuple[str, dict[str, Any]]:
    """The Markdown report and the ``comparison.json`` summary of runs ``ordered`` reference first; ``margins``:
    the equivalence margins of :func:`~hcqr_dspy.reporting.equivalence.check_margins`."""
    ref = ordered[0]
    fallbacks, warnings = fallback_table(ordered)
    invalid = invalid_table(ordered)
    evidence = evidence_table(ordered, ref)
    diversity, diversity_figures = query_diversity_section(ordered)
    gold_md, gold_figures = gold_probability_table(ordered)
    compiled_md, compiled_figures = compiled_table(ordered)
    replicates_md, replicates_figures = replicates_table(ordered, groups, margins)
    arms_md, arms_figures = arm_contrasts(ordered, groups, margins)
    planning_md, planning_figures = planning_table(ordered, groups, margins)
    gains_md, gains_figures = gain_against_gain(ordered)
    equivalence_md, equivalence_figures = equivalence_table(ordered, margins)
    calibration_md, calibration_figures = calibration_table(ordered)
    baselines_md, baselines_figures = baselines_and_letters(ordered)
    qrels_md, qrels_figures = qrels_table(ordered, qrels_path, explicit=explicit)
    controls, flags, judge_figures = judge_controls_table(ordered)
    mlflow_judges_md, mlflow_judges_figures = mlflow_judges_table(ordered)
    h_vs_cot, h_vs_cot_figures = hypothesis_vs_cot(ordered)
    agreement, agreement_figures = upstream_agreement(ordered)
    warnings += flags + dur_sample_warning(ordered)
    warnings += [
        f"{r.label} retrieves with the gold answer (an oracle): an upper bound on what retrieval can give this "
        "reader, not a method"
        for r in ordered
        if r.config.get("method") in PROGRAMS and PROGRAMS[r.config["method"]].uses_answer
    ]
    sessions = {r.label: session_summary(r) for r in ordered}
    setups = setups or setup_check(ordered)  # each run's setup; pairs that differ are confounded
    reference_table = setups.mark(comparison_table(ordered, ref))
    sections = [
        _heading(ref, qids, answered, common) + (f"\n\n{warning}" if (warning := setups.warning()) else ""),
        reference_table,
        MCNEMAR_NOTE
        + (f" {SEED_OF_ARM_NOTE}" if SEED_OF_ARM in reference_table else "")
        + (f"\n\n{note}" if (note := cache_note(ordered)) else "")
        + (f"\n\n{contended}" if (contended := contention_note(ordered)) else "")
        + (f"\n\n{dagger}" if (dagger := setups.note()) else ""),
        "## Differences from the reference (percentage points)\n\n" + setups.mark(stage_differences(ordered, ref)),
        *_section("Gold-option probability (paired)", gold_md, GOLD_PROBABILITY_NOTE),
        *_section("Zero-shot against compiled programs (paired within each method)", compiled_md, COMPILED_NOTE),
        *_section("Replicate compiles: each optimizer arm over its seeds", replicates_md, REPLICATES_NOTE),
        *_section("Optimizer arm against optimizer arm", arms_md, ARMS_NOTE),
        *_section("Planning: more seeds or more questions", planning_md, PLANNING_NOTE),
        *_section("Optimizer gain against optimizer gain (difference in differences)", gains_md, GAIN_NOTE),
        *_section("Equivalence within the margin (TOST, paired)", equivalence_md, EQUIVALENCE_NOTE),
        *_section("Calibration", calibration_md),
        *_section("Chance and letter habits", baselines_md),
        *_section("Warnings", "\n".join(f"- **{w}**" for w in warnings)),
        *_section("Invalid answers by stage and cause", invalid),
        *_section("Fallbacks", fallbacks, FALLBACKS_NOTE),
        *_section("DUR judge controls", controls, controls_note()),
        *_section("MLflow retrieval judges", mlflow_judges_md, MLFLOW_JUDGES_NOTE),
        *_section("Evidence in the context (judge-free)", evidence, EVIDENCE_NOTE),
        *_section("Query diversity", diversity, QUERY_DIVERSITY_NOTE),
        *_section("Retrieval against relevance judgments", qrels_md),
        *_section("Working hypothesis vs CoT", h_vs_cot, HYPOTHESIS_VS_COT_NOTE),
        *_section("Working hypothesis vs final answer", hypothesis_table(ordered), HYPOTHESIS_NOTE),
        *_section("Working hypotheses across runs", agreement, AGREEMENT_NOTE),
        "## Runs\n\n" + "\n".join(f"- {r.label}: `{r.path}`; {provenance_line(sessions[r.label])}" for r in ordered),
        *_section("Setups", setups.table(), SETUPS_NOTE),
        "## Questions answered differently\n\n" + disagreements(ordered, qids),
        *_section("Programs: instructions and demos", program_diff(ordered, ref)),
    ]
    summary = {
        "reference": ref.label,
        "questions": len(qids),
        "answered": answered,
        "runs": {r.label: {"path": str(r.path.resolve()), **r.metrics, **r.dur} for r in ordered},
        # only the runs tested one by one: a seed of an arm is tested pooled with its arm's other seeds
        "mcnemar": {
            r.label: mcnemar_exact(ref.correct, r.correct) for r in ordered if r is not ref and tested_alone(r.label)
        },
        "warnings": warnings,
        "fallbacks": {r.label: fallback_summary(r.rows) for r in ordered},
        "judge_controls": judge_figures,
        "mlflow_judges": mlflow_judges_figures,
        "qrels": qrels_figures,
        "query_diversity": diversity_figures,
        "gold_probability": gold_figures,
        "compiled": compiled_figures,
        "compiled_gain_difference": gains_figures,
        "replicates": replicates_figures,
        "arm_contrasts": arms_figures,
        "planning": planning_figures,
        "margins": margins or {},
        "equivalence": equivalence_figures,
        "calibration": calibration_figures,
        "baselines": baselines_figures,
        "hypothesis_vs_cot": h_vs_cot_figures,
        "upstream_agreement": agreement_figures,
        "sessions": sessions,
        "setups": setups.summary(),
    }
    return "\n\n".join(sections) + "\n", summary


def compare(
    run_dirs: Sequence[str | Path],
    reference: str | None = None,
    out_dir: str | Path | None = None,
    qrels: str | Path | None = None,
    common: bool = False,
    margin: float | None = None,
    margin_pgold: float | None = None,
    strict_setup: bool = False,
    groups: dict[str, list[str]] | None = None,
) -> tuple[str, list[Path]]:
    """Compare runs: Markdown report and plots.

    Args:
        run_dirs: Two or more run folders over the same questions.
        reference: Label (method) or folder of the reference run; default the first run.
        out_dir: Where to write ``comparison.md``, ``comparison.json`` and the PNGs (default ``./comparison``).
        qrels: Relevance judgments for recall@k / nDCG@10; default a ``qrels.json`` beside the dataset file.
        common: Runs still under way over the same question set are compared on the questions every run
            has answered (rows, metrics and judgments restricted to them; the report says how many of
            each run's questions that is). Without it, runs must hold the same questions.
        margin: Equivalence margin for accuracy differences, in percentage points (> 0, <= 100): a paired TOST
            (:mod:`~hcqr_dspy.reporting.equivalence`) for each accuracy difference the report tests.
        margin_pgold: Equivalence margin for gold-option probability differences (> 0, <= 1), the same way.
        strict_setup: Refuse runs whose setups differ, or a mixed run (:mod:`~hcqr_dspy.reporting.setups`);
            without it they are compared, flagged under the title and their deltas marked confounded.
        groups: Optimizer arms named by hand, ``{arm name: [run labels or folders]}`` (replicate compiles of one
            recipe and method); compiled runs not named are grouped from their records
            (:func:`~hcqr_dspy.reporting.replicates.replicate_groups`).

    Every p-value the report prints is numbered and Holm-adjusted over the report's family of tests
    (:mod:`~hcqr_dspy.reporting.family`); ``comparison.json``'s ``tests`` lists them.

    Returns:
        The Markdown report and the written files.

    Raises:
        HCQRError: fewer than two runs, the same folder twice, unknown reference, different
            question sets, an ``out_dir`` that is a file or cannot be created, a margin out of its range, or
            with ``strict_setup`` runs on different setups (the first differing field and the two runs named).
    """
    margins = check_margins(margin, margin_pgold)
    out = _checked_out(run_dirs, out_dir)
    programs = ProgramFolders()  # each saved-program folder read once for the whole report and its plots
    runs = [load_run(p, programs=programs) for p in run_dirs]
    unique_labels(runs)
    qids = check_same_questions([r.folder for r in runs], [r.rows for r in runs], common=common)
    check_same_gold(runs)
    answered = {r.label: len(r.rows) for r in runs}
    if common:
        for r in runs:
            restrict(r, qids)
    ref = _reference(runs, reference)
    ordered = [ref] + [r for r in runs if r is not ref]
    check_groups(ordered, groups)  # before anything is written
    setups = setup_check(ordered)
    if strict_setup:
        setups.refuse()
    # the arms of two or more seeds are tested pooled, their seeds not one by one
    seeds = {r.label for _, members in pooled_arms(ordered, groups).values() for r in members}
    with collecting() as family, seeds_tested_as_arms(seeds):  # every p-value printed joins the family of tests
        report, summary = _report(  # before anything is written: a report that fails leaves no files behind
            ordered,
            qids,
            answered,
            common,
            Path(qrels) if qrels else qrels_beside(ref.folder.dataset),
            explicit=bool(qrels),
            margins=margins,
            setups=setups,
            groups=groups,
        )
    report, summary["tests"] = family.finish(report)  # numbered, Holm-adjusted, listed near the top
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HCQRError(f"cannot create --out {out}: {exc.strerror or exc}") from None
    files = _write_plots(ordered, out)  # the reference first, as in the report
    md = out / "comparison.md"
    md.write_text(report, encoding="utf-8")
    js = out / "comparison.json"
    js.write_text(json.dumps(summary, indent=2) + "\n")
    return report, [md, js, *files]
