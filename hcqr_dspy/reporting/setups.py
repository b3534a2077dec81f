"""The setup each compared run ran on: the report's "Setups" table, the warning under its title, the ``†`` on
deltas that the setup confounds, ``comparison.json``'s ``setups`` and ``hcqr compare --strict-setup``.

A paired difference between two runs is the difference of what is compared (method, program or saved program,
its demos, its answer step) only when everything else was the same. A run's setup is read from its folder:

* from ``config.json`` (one value per run, a resume being refused when it changes): the LM spec and model name, a
  ``gguf:`` file's SHA-256, temperature, max tokens, context window, endpoint (``api_base``; in-process or a
  provider's default endpoint without one), response format, adapter; the questions (content and id SHA-256, seed,
  limit); for a method that retrieves, the index (its record without where it lies: retriever, corpus fingerprint
  and count, encoder, vector index, search options) and the retrieval settings :data:`RETRIEVAL_SETTINGS`;
* for a run of a saved program, from the program's ``meta.json``: its compile setup
  (:func:`~hcqr_dspy.reporting.setup_fields.compile_setup_field`), compared between compiled runs only, and only
  where one of them records it (then a program that records none, or a malformed record, differs from it);
* from each ``hcqr eval`` session's record (``sessions.jsonl``, which may change when a run is resumed): the
  in-process llama.cpp engine's model file SHA-256, build and CPU features, ``n_batch``, ``n_ubatch``,
  ``flash_attn``, ``use_extra_bufts`` and, with flash attention on only, its threads (whose split of the attention
  sums can change a reply: :meth:`hcqr_dspy.lm.engine_settings.EngineSettings.reply_key`); an endpoint's model
  card; the versions of dspy and, in-process, llama-cpp-python or, for an endpoint, litellm.

Each row is on the setup of the session that wrote it (rows before the first recorded session: not recorded), and
also on the setup of every reply DSPy's cache served it (``cached_setups``, :mod:`hcqr_dspy.lm.reply_setup`): a
reply made under another setup puts the row on that setup too, a reply cached without a record (or a row recorded
before rows named their cached replies' setups) on a setup not recorded. A run whose rows are on more than one
setup is *mixed*. Two runs *differ* in a field when both record it and their values differ; a field a run does not
have (an index for a method without retrieval, an engine for an endpoint) is not compared. A pair with a run none of
whose rows has a recorded setup (written before sessions were recorded) is *unverified*: flagged as a difference is,
and refused by ``--strict-setup``, since nothing shows that the two share a setup.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

from hcqr_dspy.errors import HCQRError
from hcqr_dspy.lm.reply_setup import UNRECORDED
from hcqr_dspy.reporting.runs import Run
from hcqr_dspy.reporting.setup_fields import (
    COMPILE_SETUP,
    NOT_RECORDED,
    compile_setup_field,
    field_rank,
    lm_fields,
    run_fields,
    setup_value,
    shown_value,
)

NOTE = (
    "Fields that differ between runs are columns; those with one value wherever recorded are listed above. A run "
    "is *mixed* when its rows come from more than one setup: sessions on other settings or library versions, rows "
    "written before sessions were recorded, or rows answered from cached replies made under another setup or of "
    "an unrecorded one. Threads are a setting only with flash attention on, whose sums are split across threads "
    "(EngineSettings.reply_key); without it they do not change a reply and are not compared. A field a run does "
    "not have (an index or budget for a method without retrieval, an engine for an endpoint) or did not record "
    "(–) is not compared. What is compared (method, program or saved program, demos, answer step) is no setup field; "
    "a saved program's compile setup (the fingerprint of the setup its compile ran on, and of any other setup whose "
    "cached replies it was served) is, between compiled runs: seeds of one arm compiled on different setups differ "
    "in more than their seed."
)


@dataclass
class Part:
    """Rows of a run on one setup: its session-recorded fields (``recorded`` false: not recorded) and why."""

    recorded: bool
    fields: dict[str, Any]
    rows: set[str] = field(default_factory=set)
    how: list[str] = field(default_factory=list)


@dataclass
class ArmSetup:
    """A run's setup: its ``config.json`` fields and the parts its rows are on (more than one: mixed)."""

    label: str
    rows: int
    common: dict[str, Any]
    parts: list[Part]

    @property
    def mixed(self) -> bool:
        return len(self.parts) > 1

    def values(self, name: str) -> list[Any]:
        """The recorded values of field ``name`` over the run's parts, each once."""
        found = [self.common.get(name)] + [p.fields.get(name) for p in self.parts]
        return list(dict.fromkeys(v for v in found if v is not None))

    def names(self) -> set[str]:
        return {k for k, v in self.common.items() if v is not None} | {k for p in self.parts for k in p.fields}


def arm_setup(run: Run) -> ArmSetup:
    """The setup of ``run``'s rows (see the module docstring)."""
    config = run.config
    sha = (config.get("lm") or {}).get("sha256")  # a gguf: file's, where sessions do not name it
    fallback = {"model file": setup_value(sha)} if sha else {}
    parts: list[Part] = []

    def add(recorded: bool, fields: dict[str, Any], qid: str, how: str) -> None:
        fields = {**fallback, **fields}
        # a session record lacking a field another holds is on the same setup where the fields both hold agree
        part = next((p for p in parts if p.recorded == recorded and _agree(p.fields, fields)), None)
        if part is None:
            part = Part(recorded, fields)
            parts.append(part)
        part.fields.update(fields)
        part.rows.add(qid)
        if how not in part.how:
            part.how.append(how)

    evals = [s for s in run.folder.sessions() if s.get("command") == "eval"]
    position = {r["qid"]: i for i, r in enumerate(run.folder.predictions.read())}
    for row in run.rows:
        owner = None
        for s in evals:
            if s["predictions_before"] <= position.get(row["qid"], -1):
                owner = s
        if owner is None:
            add(False, {}, row["qid"], "written before sessions were recorded")
        else:
            card = owner.get("endpoint")
            fields = lm_fields(owner.get("engine"), card, owner.get("packages"), owner.get("questions_in_flight"))
            add(True, fields, row["qid"], "written in a session")
        entries = row.get("cached_setups")
        if entries is None:
            if (row.get("cached_lm_calls") or 0) > 0 and owner is not None:
                add(False, {}, row["qid"], "cached replies recorded before their setups were")
            continue
        for entry in entries if isinstance(entries, list) else []:
            record = entry.get("record") if isinstance(entry, dict) else None
            if isinstance(record, dict):
                fields = lm_fields(record.get("engine"), record.get("endpoint"), record.get("packages"))
                add(True, fields, row["qid"], "cached replies made under another setup")
            elif not isinstance(entry, dict) or entry.get("setup") == UNRECORDED:
                add(False, {}, row["qid"], "cached replies of an unrecorded setup")
    common = run_fields(config)
    if run.program is not None:  # a saved program: the setup its compile ran on, compared between compiled runs
        common[COMPILE_SETUP] = compile_setup_field(run.program.meta[0])  # setup_check drops it where none has one
    return ArmSetup(run.label, len(run.rows), common, parts)


def _agree(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(a[k] == b[k] for k in a.keys() & b.keys())


def differences(a: ArmSetup, b: ArmSetup) -> dict[str, tuple[list[Any], list[Any]]]:
    """The fields both runs record with other values: ``{field: (a's values, b's values)}``, in field order."""
    out = {}
    for name in sorted(a.names() & b.names(), key=field_rank):
        va, vb = a.values(name), b.values(name)
        if va and vb and set(va) != set(vb):
            out[name] = (va, vb)
    return out


def mixed_fields(arm: ArmSetup) -> list[str]:
    """What a mixed run's setups differ in: the fields with several recorded values, and ``not recorded for some
    rows`` when some of its rows are on a setup that was not recorded."""
    names = sorted({k for p in arm.parts for k in p.fields}, key=field_rank)
    varying = [k for k in names if len({p.fields.get(k) for p in arm.parts if k in p.fields}) > 1]
    if len({p.recorded for p in arm.parts}) > 1:
        varying.append("not recorded for some rows")
    return varying or (["setup"] if arm.mixed else [])


@dataclass
class SetupCheck:
    """The runs' setups compared (:func:`setup_check`)."""

    arms: list[ArmSetup]
    pairs: dict[tuple[str, str], dict[str, tuple[list[Any], list[Any]]]]
    confounded: dict[str, list[str]]  # a run against the reference -> why its delta is confounded
    # a pair of runs -> those of the two whose rows were written on no recorded setup: the pair cannot be checked
    unverified: dict[tuple[str, str], list[str]] = field(default_factory=dict)

    @property
    def one_setup(self) -> bool:
        return not any(self.pairs.values()) and not any(a.mixed for a in self.arms) and not self.unverified

    def warning(self) -> str:
        """The line under the report's title naming every pair of runs that differ and every mixed run; ``""``
        when they ran on one setup."""
        if self.one_setup:
            return ""
        said = [f"{a} and {b} differ in {', '.join(d)}" for (a, b), d in self.pairs.items() if d]
        said += [f"{a.label} is mixed ({', '.join(mixed_fields(a))})" for a in self.arms if a.mixed]
        unchecked = sorted({label for who in self.unverified.values() for label in who})
        if unchecked:
            said.append(
                f"no setup (engine, build, endpoint, library versions) was recorded for {', '.join(unchecked)}, so "
                "whether they share one with the other runs cannot be checked"
            )
        head = "Setups differ" if any(self.pairs.values()) or any(a.mixed for a in self.arms) else "Setups unverified"
        return (
            f"**{head}: " + "; ".join(said) + ".** Differences between these runs may not be their programs' "
            "alone; confounded or unverified deltas are marked † (see Setups)."
        )

    def mark(self, table: str) -> str:
        """``table`` (Markdown, a run's label in its first cell) with ``†`` after each confounded run's label."""
        lines = table.split("\n")
        for label in self.confounded:
            lines = [
                f"| {label} † |" + ln[len(f"| {label} |") :] if ln.startswith(f"| {label} |") else ln for ln in lines
            ]
        return "\n".join(lines)

    def note(self) -> str:
        """The note under the comparison table on its † marks; ``""`` without any."""
        if not self.confounded:
            return ""
        return (
            "† confounded, its delta not its program's alone: "
            + "; ".join(f"{label} ({', '.join(why)})" for label, why in self.confounded.items())
            + " (see Setups)."
        )

    def table(self) -> str:
        """The Setups section: one row per run with the fields that vary, the shared ones in one line."""
        names = sorted(set().union(*(a.names() for a in self.arms)), key=field_rank)
        values = {n: {v for a in self.arms for v in a.values(n)} for n in names}
        varying = [n for n in names if len(values[n]) > 1 or any(len(a.values(n)) > 1 for a in self.arms)]
        shared = [n for n in names if n not in varying]
        unrecorded = [a.label for a in self.arms if any(not p.recorded for p in a.parts)]
        if any(self.pairs.values()):
            head = "The runs ran on different setups."
        elif any(a.mixed for a in self.arms):
            head = "Some runs are mixed."
        elif self.unverified:
            head = "Whether the runs share one setup cannot be checked."
        elif unrecorded:
            head = f"The {len(self.arms)} runs' recorded setups agree."
        else:
            head = f"All {len(self.arms)} runs ran on one setup."
        if unrecorded:
            head += f" Engine, endpoint and library versions were not recorded for rows of: {', '.join(unrecorded)}."
        groups: dict[tuple[str, ...], list[str]] = {}  # the runs that record a shared field -> the fields
        for n in shared:
            who = tuple(a.label for a in self.arms if a.values(n))
            groups.setdefault(who, []).append(f"{n} {shown_value(next(iter(values[n])))}")
        for who, said in groups.items():
            whom = "every run" if len(who) == len(self.arms) else ", ".join(who) + " only"
            head += f" Recorded for {whom}: " + "; ".join(said) + "."
        lines = [
            "| " + " | ".join(["run", "rows", "setup", *varying]) + " |",
            "|---|---:|" + "---|" * (1 + len(varying)),
        ]
        for a in self.arms:
            setup = f"mixed: {len(a.parts)} setups ({', '.join(mixed_fields(a))})" if a.mixed else "one setup"
            setup += "" if a.mixed or a.parts[0].recorded else " (not recorded)"
            cells = [a.label, str(a.rows), setup, *(self._cell(a, n) for n in varying)]
            lines.append("| " + " | ".join(cells) + " |")
        return head + "\n\n" + "\n".join(lines)

    @staticmethod
    def _cell(arm: ArmSetup, name: str) -> str:
        if name in arm.common or not any(name in p.fields for p in arm.parts):
            return shown_value(arm.common.get(name))
        if not arm.mixed:
            return shown_value(arm.parts[0].fields.get(name))
        cells = [
            shown_value(p.fields.get(name)) if p.recorded or name in p.fields else "not recorded" for p in arm.parts
        ]
        return " / ".join(f"{cell} ({len(p.rows)} rows)" for cell, p in zip(cells, arm.parts))

    def summary(self) -> dict[str, Any]:
        """``comparison.json``'s ``setups``."""
        return {
            "one_setup": self.one_setup,
            "runs": {
                a.label: {
                    "rows": a.rows,
                    "mixed": a.mixed,
                    "fields": a.common,
                    "setups": [
                        {"recorded": p.recorded, "rows": len(p.rows), "how": p.how, "fields": p.fields} for p in a.parts
                    ],
                }
                for a in self.arms
            },
            "pairs": [
                {"runs": [a, b], "fields": {k: {a: va, b: vb} for k, (va, vb) in d.items()}}
                for (a, b), d in self.pairs.items()
                if d
            ],
            "mixed": {a.label: mixed_fields(a) for a in self.arms if a.mixed},
            "confounded": self.confounded,
            "unverified": [{"runs": list(pair), "not_recorded": who} for pair, who in self.unverified.items()],
        }

    def refuse(self) -> None:
        """``--strict-setup``: refuse runs that differ in their setup, or a mixed run.

        Raises:
            HCQRError: naming the first differing field and the two runs (or the mixed run and its setups).
        """
        for (a, b), d in self.pairs.items():
            for name, (va, vb) in d.items():
                raise HCQRError(
                    f"--strict-setup: runs {a} and {b} differ in {name} ({' / '.join(map(shown_value, va))} vs "
                    f"{' / '.join(map(shown_value, vb))}); nothing written"
                )
        for arm in self.arms:
            if arm.mixed:
                raise HCQRError(
                    f"--strict-setup: run {arm.label} is mixed: its rows come from {len(arm.parts)} setups "
                    f"({', '.join(mixed_fields(arm))}); nothing written"
                )
        for (a, b), who in self.unverified.items():
            raise HCQRError(
                f"--strict-setup: runs {a} and {b} cannot be checked: no setup was recorded for {' and '.join(who)} "
                "(its rows were written before sessions were recorded); nothing written"
            )


def pair_confounds(a: Run, b: Run) -> list[str]:
    """Why a paired difference of runs ``a`` and ``b`` is not their programs' alone: the setup fields they differ
    in, ``mixed`` where either's rows come from several setups, ``setup not recorded`` where either recorded none;
    empty on one setup."""
    arm_a, arm_b = arm_setup(a), arm_setup(b)
    why = list(differences(arm_a, arm_b))
    why += ["mixed"] if arm_a.mixed or arm_b.mixed else []
    unrecorded = [arm for arm in (arm_a, arm_b) if not arm.mixed and not any(p.recorded for p in arm.parts)]
    return why + (["setup not recorded"] if unrecorded else [])


def setup_check(runs: Sequence[Run]) -> SetupCheck:
    """The setups of ``runs`` (the reference first) compared: every pair's differences, and for each other run
    why its delta against the reference is confounded (its differences, its or the reference's mixed setups)."""
    arms = [arm_setup(r) for r in runs]
    compiled = [a for a in arms if COMPILE_SETUP in a.common]
    if all(a.common[COMPILE_SETUP] in (NOT_RECORDED, None) for a in compiled):  # none recorded: nothing to compare
        for a in compiled:
            a.common[COMPILE_SETUP] = None
    pairs = {(a.label, b.label): differences(a, b) for a, b in combinations(arms, 2)}
    unrecorded = {a.label for a in arms if not a.mixed and not any(p.recorded for p in a.parts)}
    unverified = {
        (a.label, b.label): [x for x in (a.label, b.label) if x in unrecorded]
        for a, b in combinations(arms, 2)
        if a.label in unrecorded or b.label in unrecorded
    }
    ref = arms[0]
    confounded: dict[str, list[str]] = {}
    for arm in arms[1:]:
        why = list(pairs[(ref.label, arm.label)])
        why += ["mixed"] if arm.mixed else []
        why += ["the reference mixed"] if ref.mixed else []
        why += ["setup not recorded"] if arm.label in unrecorded else []
        why += ["the reference's setup not recorded"] if ref.label in unrecorded else []
        if why:
            confounded[arm.label] = why
    return SetupCheck(arms, pairs, confounded, unverified)
