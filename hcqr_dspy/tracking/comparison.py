"""A comparison written by :func:`hcqr_dspy.reporting.compare`, recorded as an MLflow run."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from hcqr_dspy.evaluation.records import read_json_object
from hcqr_dspy.evaluation.run_folder import RunFolder
from hcqr_dspy.reporting.family import MCNEMAR, REFERENCE, SEED_OF_ARM, compared
from hcqr_dspy.reporting.stats import format_difference, format_mde
from hcqr_dspy.tracking.mlflow_runs import mlflow_run, mlflow_run_link


def _metric_label(label: str) -> str:
    """A run label as part of an MLflow metric name (letters, digits, ``_ - . / :`` and spaces)."""
    return re.sub(r"[^\w.\- /:]", "_", label)


def _metric_key(name: str) -> str:
    """``name`` within MLflow's 250-character limit on a metric name (``mlflow.utils.validation``'s
    ``MAX_ENTITY_KEY_LENGTH``): a longer one keeps its first 241 characters, a ``-`` and 8 hex digits of its
    SHA-1, so that two long names stay apart."""
    if len(name) <= 250:
        return name
    return f"{name[:241]}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"


def track_comparison(out_dir: str | Path, mlflow_dir: str | Path | None = None) -> str:
    """Record a comparison written by :func:`hcqr_dspy.reporting.compare` as an MLflow run (a child run when
    one is active).

    The run is named after what it compares (``compare hcqr vs simple_rag · medqa · local``) and tagged
    ``kind=comparison``, ``reference``, ``runs`` (the compared MLflow run ids, comma-separated) and
    ``run.<label>`` (each one's id); its description links each compared run. Its inputs are the compared runs'
    question sets and models, tagged ``model.<label>`` (:func:`link_compared_runs`). Metrics, per compared run
    label: ``accuracy.<label>``, ``delta_accuracy.<label>`` (minus the reference's), ``mcnemar_p.<label>``
    (exact McNemar against the reference; only for a run tested alone, not for a seed of an optimizer arm of two
    or more seeds, which the report tests pooled over its seeds), ``dur.<label>`` (when judged) and ``lm_calls.<label>``
    (LM calls per question), and ``mcnemar_p_holm.<label>``, that p-value Holm-adjusted over the report's family of
    tests. Every numbered test of the report (the summary's ``tests``): ``test_p.<number>`` and
    ``test_p_holm.<number>`` (raw and Holm-adjusted), the param ``test_family_size`` and a table of them in the
    description. Where the comparison pairs compiled programs with zero-shot runs (the summary's
    ``compiled`` and ``compiled_gain_difference``), per compiled run ``compiled.delta_accuracy.<label>``,
    ``compiled.delta_gold_prob.<label>`` and their MDEs ``compiled.mde_accuracy.<label>``,
    ``compiled.mde_gold_prob.<label>`` (compiled minus its zero-shot run, paired), per two methods' gains
    ``gain_difference.accuracy.<first> vs <second>``, ``gain_difference.gold_prob.<...>`` and their MDEs
    ``gain_difference.mde_accuracy.<...>``, ``gain_difference.mde_gold_prob.<...>``, and the
    description gains a table of them. The report, the JSON summary and the plots are its artifacts.

    Args:
        out_dir: The folder :func:`hcqr_dspy.reporting.compare` wrote (``comparison.json`` and the files beside it).
        mlflow_dir: MLflow store folder.

    Returns:
        The comparison run's id.

    Raises:
        HCQRError: ``out_dir`` holds no readable ``comparison.json``.
    """
    import mlflow

    out = Path(out_dir)
    summary = read_json_object(out / "comparison.json", "comparison summary")
    labels = list(summary["runs"])
    ref = summary["reference"]
    folders = {label: RunFolder(info["path"]) for label, info in summary["runs"].items()}
    first = folders[ref].config if (folders[ref].path / "config.json").is_file() else {}
    dataset = Path(first.get("dataset", "")).stem or "?"
    lm = (first.get("lm") or {}).get("spec") or "?"
    run_ids = {
        label: (f.config.get("mlflow_run_id") if (f.path / "config.json").is_file() else None)
        for label, f in folders.items()
    }
    name = f"compare {' vs '.join(labels)} · {dataset} · {lm}"
    tags = {
        "kind": "comparison",
        "reference": ref,
        "dataset": dataset,
        "runs": ",".join(r for r in run_ids.values() if r),
        **{f"run.{_metric_label(label)}": rid for label, rid in run_ids.items() if rid},
    }
    tests = summary.get("tests") or []  # a comparison written before the family was numbered has none
    params = {"reference": ref, "questions": summary["questions"], "test_family_size": len(tests)}
    reference_tests = {
        t["label"]: t for t in tests if t["section"] == REFERENCE and t["test"] == MCNEMAR and t["margin"] is None
    }
    with mlflow_run(name, params, tags=tags, store=mlflow_dir, traces=False) as run:
        link_compared_runs(run.info.run_id, run_ids)
        metrics: dict[str, float] = {}
        ref_acc = summary["runs"][ref].get("accuracy")
        for label, info in summary["runs"].items():
            key = _metric_label(label)
            metrics[f"accuracy.{key}"] = info["accuracy"]
            metrics[f"lm_calls.{key}"] = info["mean_lm_calls"]
            if info.get("dur") is not None:
                metrics[f"dur.{key}"] = info["dur"]
            if label != ref:
                metrics[f"delta_accuracy.{key}"] = info["accuracy"] - ref_acc
                if label in summary["mcnemar"]:  # a seed of an arm of seeds is tested pooled, not alone
                    metrics[f"mcnemar_p.{key}"] = summary["mcnemar"][label]["p_value"]
                if (t := reference_tests.get(compared(ref, label, "accuracy"))) is not None:
                    metrics[f"mcnemar_p_holm.{key}"] = t["p_holm"]
        for t in tests:
            metrics[f"test_p.{t['number']}"] = t["p_value"]
            metrics[f"test_p_holm.{t['number']}"] = t["p_holm"]
        compiled_metrics, compiled_lines = _compiled(summary)
        mlflow.log_metrics({_metric_key(k): v for k, v in {**metrics, **compiled_metrics}.items()})
        lines = [
            f"Paired comparison on {summary['questions']} questions of `{dataset}` (reference: **{ref}**).",
            "",
            "| run | accuracy | Δ vs reference | McNemar p | MLflow run |",
            "|---|---:|---:|---:|---|",
        ]
        for label in labels:
            info = summary["runs"][label]
            delta = "reference" if label == ref else f"{(info['accuracy'] - ref_acc) * 100:+.1f} pts"
            if label == ref:
                p = ""
            elif label in summary["mcnemar"]:
                p = f"{summary['mcnemar'][label]['p_value']:.3g}"
            else:
                p = SEED_OF_ARM
            if (t := reference_tests.get(compared(ref, label, "accuracy"))) is not None:
                p += f" (#{t['number']}; Holm {t['p_holm']:.3g})"
            link = mlflow_run_link(run_ids[label]) if run_ids[label] else None
            lines.append(f"| {label} | {info['accuracy']:.1%} | {delta} | {p} | {link or '–'} |")
        mlflow.set_tag("mlflow.note.content", "\n".join(lines + compiled_lines + _tests_lines(tests)))
        for f in sorted(out.iterdir()):
            if f.is_file() and f.suffix in (".md", ".json", ".png"):
                mlflow.log_artifact(str(f), artifact_path="comparison")
        return run.info.run_id


def link_compared_runs(run_id: str, run_ids: dict[str, str | None]) -> dict[str, str]:
    """Give the comparison run ``run_id`` the inputs of the runs it compares: each one's question set (the
    ``mlflow.entities.Dataset`` that run logged, same name and content digest; input context ``comparison``) and
    the LoggedModel it evaluated (its model input, else its tag ``model_id``), each model also as the tag
    ``model.<label>``. Compared runs that are not in this store, or have no run id, are left out.

    Args:
        run_id: The comparison run.
        run_ids: The compared runs' MLflow run ids by label (``None``: a run folder never tracked).

    Returns:
        The model id linked per label.
    """
    import mlflow
    from mlflow.entities import DatasetInput, InputTag, LoggedModelInput
    from mlflow.exceptions import MlflowException

    client = mlflow.MlflowClient()
    datasets: dict[tuple[str, str], object] = {}
    models: dict[str, str] = {}
    for label, rid in run_ids.items():
        if not rid:
            continue
        try:
            compared_run = client.get_run(rid)
        except MlflowException:  # recorded in another store
            continue
        for entry in compared_run.inputs.dataset_inputs:
            datasets.setdefault((entry.dataset.name, entry.dataset.digest), entry.dataset)
        model_ids = [m.model_id for m in compared_run.inputs.model_inputs] or [compared_run.data.tags.get("model_id")]
        if model_ids[0]:
            models[label] = model_ids[0]
    context = [InputTag(key="mlflow.data.context", value="comparison")]
    if datasets or models:
        client.log_inputs(
            run_id,
            datasets=[DatasetInput(dataset=d, tags=context) for d in datasets.values()],
            models=[LoggedModelInput(m) for m in dict.fromkeys(models.values())],
        )
    for label, model_id in models.items():
        client.set_tag(run_id, f"model.{_metric_label(label)}", model_id)
    return models


def _tests_lines(tests: list[dict]) -> list[str]:
    """The description's table of the report's numbered tests (none without)."""
    if not tests:
        return []
    return [
        "",
        f"Tests in the report (family of {len(tests)}; Holm-adjusted):",
        "",
        "| # | compares | test | p | Holm p | rejected at 5% after Holm |",
        "|---:|---|---|---:|---:|---|",
        *(
            f"| {t['number']} | {t['label']} | {t['test']} | {t['p_value']:.3g} | {t['p_holm']:.3g} | "
            f"{'yes' if t['reject'] else 'no'} |"
            for t in tests
        ),
    ]


def _difference_metrics(prefix: str, mde_prefix: str, key: str, diffs: dict[str, dict]) -> dict[str, float]:
    """``<prefix><outcome>.<key>`` (the mean difference) and ``<mde_prefix><outcome>.<key>`` (its MDE) for each
    outcome's paired difference that has them."""
    out: dict[str, float] = {}
    for name, d in diffs.items():
        if d.get("mean_diff") is not None:
            out[f"{prefix}{name}.{key}"] = d["mean_diff"]
        if d.get("mde") is not None:
            out[f"{mde_prefix}{name}.{key}"] = d["mde"]
    return out


def _compiled(summary: dict) -> tuple[dict[str, float], list[str]]:
    """The metrics and description lines of a comparison's compiled pairs and gain differences (none without)."""
    pairs, gains = summary.get("compiled") or {}, summary.get("compiled_gain_difference") or {}
    metrics: dict[str, float] = {}
    if not pairs:
        return metrics, []
    lines = [
        "",
        "Compiled against zero-shot, paired (accuracy in points with its 95% bootstrap interval; MDE: the smallest "
        "difference detectable; p(gold) as a probability):",
        "",
        "| compiled | zero-shot | n | Δ accuracy | accuracy MDE | Δ p(gold) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for delta, mde, runs, acc_key, gold_key in (
        ("compiled.delta_", "compiled.mde_", pairs, "accuracy_diff", "gold_prob_diff"),
        ("gain_difference.", "gain_difference.mde_", gains, "accuracy_gain_diff", "gold_prob_gain_diff"),
    ):
        for label, f in runs.items():
            diffs = {"accuracy": f[acc_key], "gold_prob": f[gold_key]}
            metrics.update(_difference_metrics(delta, mde, _metric_label(label), diffs))
    lines += [
        f"| {label} | {f['zero_shot']} | {f['questions']} | {format_difference(f['accuracy_diff'], 100, 1)} | "
        f"{format_mde(f['accuracy_diff']['mde'], 100, 1)} | {format_difference(f['gold_prob_diff'])} |"
        for label, f in pairs.items()
    ]
    lines += [
        f"\nGain of {g['first'][1]} over {g['first'][0]} minus gain of {g['second'][1]} over {g['second'][0]}, "
        f"{g['questions']} questions: {format_difference(g['accuracy_gain_diff'], 100, 1)} points "
        f"(MDE {format_mde(g['accuracy_gain_diff']['mde'], 100, 1, limit=2)}); "
        f"p(gold) {format_difference(g['gold_prob_gain_diff'])}."
        for g in gains.values()
    ]
    return metrics, lines
