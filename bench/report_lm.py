"""RESULTS.md sections of the LM path: raw llama.cpp rates per build (``bench/lm.py``) and the product against
them with the cost per method (``bench/lm_pipeline.py``)."""

from __future__ import annotations


def render_lm(section: dict) -> list[str]:
    """RESULTS.md lines of the ``lm`` section."""
    lines = [
        f"## LM path: raw llama.cpp rates per build ({section['threads']} threads; measured {section['date']} "
        "by `bench/lm.py`)",
        "",
        "Prefill: a prompt of N tokens decoded from an empty KV cache (`Llama.eval`, n_batch 512); generation: 64"
        " tokens one at a time after a 300-token prompt. Best of the repeats; tokens/s. `bufts` is"
        " llama.cpp's weight repacking (`use_extra_bufts`), `fa` its flash attention; the engine's defaults are"
        " flash attention on and repacking off for AVX-512 builds, on for the others"
        " (`hcqr_dspy/lm/engine_settings.py`), llama-cpp-python's `bufts on, fa off`.",
        "",
    ]
    lengths = section["lengths"]
    lines += [
        "| model | build | settings | "
        + " | ".join(f"prefill {n}" for n in lengths)
        + " | generation | CPU contention |",
        "|---|---|---|" + "---:|" * (len(lengths) + 2),
    ]
    for build, models in section["builds"].items():
        if "error" in models:
            lines.append(f"| – | {build} | – | failed: {models['error']} |")
            continue
        for model, by_setting in models.items():
            for setting, m in by_setting.items():
                rates = " | ".join(str(m["prefill_tokens_per_s"][str(n)]) for n in lengths)
                pressure = m.get("cpu_pressure")  # absent from results measured before it was recorded
                shown = "–" if pressure is None else f"{pressure:.0%}"
                lines.append(f"| {model} | {build} | {setting} | {rates} | {m['generation_tokens_per_s']} | {shown} |")
    for model, ratio in section.get("fastest_over_portable", {}).items():
        lines.append("")
        lines.append(
            f"{model}: the fastest build with the engine's defaults prefills {ratio['prefill']}x and generates "
            f"{ratio['generation']}x the portable build with llama-cpp-python's defaults, at {lengths[-1]} tokens."
        )
    for note in section.get("notes", []):  # what the person who ran it saw disturb it, added to results.json
        lines += ["", f"Note: {note}"]
    return lines + [""]


def render_lm_pipeline(section: dict) -> list[str]:
    """RESULTS.md lines of the ``lm_pipeline`` section (``bench/lm_pipeline.py``)."""
    e = section["engine"]
    lines = [
        f"## LM path: the product against raw llama.cpp, and the cost per method ({section['model']}, "
        f"{e['n_threads']} threads, {e['build']} build; measured {section['date']} by `bench/lm_pipeline.py`)",
        "",
        f"Runs: {section['runs']}"
        + (f" (the whole demo: {section['demo_seconds']} s)" if section.get("demo_seconds") else "")
        + ". Raw: llama.cpp's own prefill and generation seconds at the same prompt lengths, "
        "in the same process and engine settings, measured once after the run (best of two); a stage's efficiency "
        "is the raw seconds predicted for its tokens over its measured seconds (above 1: the prompt cache skipped a "
        "prefix). The machine's speed drifts during a run, which this comparison cannot separate from the "
        "product's overhead; the paired sections (`bench/lm_overhead.py`) below do. Rows with cached "
        f"replies left out: {section['left_out_cached'] or 'none'}.",
        "",
        "| method | questions | accuracy | LM calls | prompt tokens | completion tokens | seconds (mean) | "
        "seconds (median) | efficiency |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for method, m in section["methods"].items():
        lines.append(
            f"| {method} | {m['questions']} | {m['accuracy']} | {m['lm_calls']} | {m['prompt_tokens']} | "
            f"{m['completion_tokens']} | {m['seconds_mean']} | {m['seconds_median']} | {m['efficiency']} |"
        )
    lines += [
        "",
        "| method | stage | calls | prompt tokens | completion tokens | seconds | raw seconds | product tok/s | "
        "raw tok/s | efficiency |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for method, m in section["methods"].items():
        for stage, st in m["stages"].items():
            lines.append(
                f"| {method} | {stage} | {st['calls']} | {st['prompt']} | {st['completion']} | {st['seconds']} | "
                f"{st['raw']} | {st['product_tokens_per_s']} | {st['raw_tokens_per_s']} | {st['efficiency']} |"
            )
    if "hcqr_over_simple_rag" in section:
        lines += ["", f"HCQR / Simple RAG mean wall time per question: {section['hcqr_over_simple_rag']}."]
    return lines + [""]


def render_lm_overhead(section: dict) -> list[str]:
    """RESULTS.md lines of an ``lm_overhead`` section (``bench/lm_overhead.py``); sections measured before the
    option scoring was timed apart count it in the product's seconds, and those measured before ``--budget`` showed
    Simple RAG the paper's 15 passages."""
    e = section["engine"]
    lines = [
        f"## LM path: product calls paired with raw llama.cpp on the same tokens ({section['model']}, "
        f"{e['n_threads']} threads, {e['build']} build; measured {section['date']} by `bench/lm_overhead.py`)",
        "",
        f"Each method's answer step on the first {section['limit']} demo questions (Simple RAG showing "
        f"{section.get('budget', 15)} passages; DSPy, the HCQR adapter, the "
        "in-process engine, no response or prompt cache), followed at once by raw llama.cpp (`Llama.eval`, greedy "
        "argmax) on the same numbers of prompt and completion tokens; efficiency is raw over product seconds per "
        "pair (mean with its 95% t interval, median, extremes). The answer step's option scoring (one prefill of "
        "its reply for the letter distribution) is timed apart: its mean seconds and tokens, and the efficiency with "
        "it counted in the product's seconds.",
        "",
        "| method | pairs | prompt tokens | completion tokens | product s (mean) | raw s (mean) | efficiency (mean) | "
        "95% interval | median | range | scoring s (tokens) | efficiency with scoring |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|---|---|---:|",
    ]
    for method, m in section["methods"].items():
        ci = "–".join(str(x) for x in m["efficiency_ci95"]) if m["efficiency_ci95"] else "n/a"
        if "scoring_s_mean" in m:
            scoring = f"{m['scoring_s_mean']} ({m['scoring_tokens_mean']})"
            with_scoring = m["efficiency_with_scoring_mean"]
        else:
            scoring, with_scoring = "in product s", m["efficiency_mean"]
        lines.append(
            f"| {method} | {m['pairs']} | {m['prompt_tokens']} | {m['completion_tokens']} | {m['product_s_mean']} | "
            f"{m['raw_s_mean']} | {m['efficiency_mean']} | {ci} | {m['efficiency_median']} | "
            f"{m['efficiency_range'][0]}–{m['efficiency_range'][1]} | {scoring} | {with_scoring} |"
        )
    return lines + [""]


def render_lm_ratio(section: dict) -> list[str]:
    """RESULTS.md lines of an ``lm_ratio`` section (``bench/lm_ratio.py``): both methods per question back to back,
    the ratio of their mean wall times with its paired interval, and HCQR's stages."""
    e, methods = section["engine"], section["methods"]
    ids = [r["id"] for r in methods["hcqr"]["rows"]]
    ci = section["ratio_ci95"]
    target, ratio = section["target"], section["ratio_of_means"]
    if ci is None:
        verdict = "no interval under 5 questions"
    elif ci[1] <= target:
        verdict = f"target <= {target}: met, the whole interval below it"
    elif ratio <= target:
        verdict = f"target <= {target}: met by the estimate, the interval reaching above it"
    else:
        verdict = f"target <= {target}: not met"
    threads = f"{e['n_threads']} thread{'s' if e['n_threads'] != 1 else ''}"
    questions = f"demo questions {ids[0]} to {ids[-1]}" if len(ids) > 1 else f"demo question {ids[0]}"
    warm = section["warmup_seconds"]
    if section["warmup"]:
        warmup = (
            f"after {section['warmup']} warm-up question{'s' if section['warmup'] > 1 else ''} not counted (seconds: "
            f"HCQR {', '.join(str(round(x, 1)) for x in warm['hcqr'])}, Simple RAG "
            f"{', '.join(str(round(x, 1)) for x in warm['simple_rag'])})"
        )
    else:
        warmup = "with no warm-up question"
    lines = [
        f"## LM path: HCQR / Simple RAG wall time, paired per question ({section['model']}, {threads}, "
        f"{e['build']} build, {section['cpu']}; measured {section['date']} by `bench/lm_ratio.py`)",
        "",
        f"Both methods on each of the {questions}, one right after the other in alternating order, {warmup}; "
        f"{section['budget']} passages each; DSPy's response cache off, the engine's prompt cache on. A question's "
        "wall time is the program call's (retrieval, LM calls, option scoring).",
        "",
        "| method | questions | invalid | seconds (mean) | seconds (median) | LM calls | prompt tokens | "
        "completion tokens |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, m in methods.items():
        lines.append(
            f"| {name} | {m['questions']} | {m['invalid']} | {m['seconds_mean']} | {m['seconds_median']} | "
            f"{m['lm_calls']} | {m['prompt_tokens']} | {m['completion_tokens']} |"
        )
    lines += ["", "| HCQR stage | seconds (mean) | prompt tokens | completion tokens |", "|---|---:|---:|---:|"]
    for name, s in methods["hcqr"]["stages"].items():
        lines.append(f"| {name} | {s['seconds']} | {s['prompt_tokens']} | {s['completion_tokens']} |")
    shown_ci = f" [{ci[0]}, {ci[1]}] (95% paired BCa bootstrap)" if ci else ""
    low, high = section["per_question_range"]
    return lines + [
        "",
        f"HCQR / Simple RAG mean wall time per question: **{ratio}**{shown_ci}; {verdict}. Per question: median "
        f"{section['per_question_median']}, range {low} to {high}.",
        "",
    ]
