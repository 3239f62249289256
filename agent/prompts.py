"""The LLM's system prompt and first message: text files in prompts/, filled with workload facts."""

from __future__ import annotations

from string import Template

from agent.tools import PROMPTS


def _load(name: str) -> Template:
    return Template((PROMPTS / name).read_text())


def budget_text(session) -> str:
    b = session.budget
    parts = [f"{b.evaluations_left} evaluations"]
    if b.max_turns is not None:
        parts.append(f"{b.max_turns} turns")
    if b.max_tokens is not None:
        parts.append(f"{b.max_tokens} tokens")
    if b.time_limit is not None:
        parts.append(f"{b.time_limit:g} s")
    return ", ".join(parts)


def system_prompt(session) -> str:
    from emmy.schedule.row import KEYS
    from emmy.schedule.space import GRAMMAR_TEXT

    modeled = session.timing_method == "modeled"
    note = ("There is no GPU here: every time comes from the cost model, and correctness is "
            "checked by running the emitted CUDA on the CPU." if modeled else
            "Times are CUDA-event medians on the GPU; small differences within the p10..p90 "
            "spread are noise.")
    grammar = "\n".join(f"- {k}: {text}" for k, text in GRAMMAR_TEXT.items())
    kinds: dict[str, dict[str, str]] = {}
    for k in session.kernel_summaries():
        if k.kind in ("contract", "attention", "chain"):
            kinds.setdefault(k.kind, session.ev.grammar_text(k.name))
    for kind, text in kinds.items():
        title = {"contract": "Matrix-product kernels (kind contract) decide instead",
                 "attention": "Attention kernels (kind attention) decide instead",
                 "chain": "Chained-product kernels (kind chain) decide instead"}[kind]
        grammar += f"\n{title}:\n" + "\n".join(f"- {k}: {t}" for k, t in text.items())
    return _load("system.txt").substitute(
        workload=session.ev.workload_name, target=session.ev.target, device=session.ev.device,
        timing_method=session.timing_method, timing_note=note, keys=" ".join(KEYS),
        grammar=grammar, budget=budget_text(session))


def task_prompt(session, shares: dict[str, int] | None = None) -> str:
    kernels = "\n".join(f"- {k.name} ({k.kind}): {k.count} legal rows; decides {' '.join(k.keys)};"
                        f" default `{k.default_row}`"
                        + (f"; best known (schedule database) `{session.recorded[k.name]}`"
                           if k.name in session.recorded else "")
                        for k in session.kernel_infos.values())
    split = ""
    if shares and len(shares) > 1:
        split = "Suggested split by expected gain: " + ", ".join(
            f"{k} {n}" for k, n in shares.items()) + "."
    return _load("task.txt").substitute(workload=session.ev.workload_name,
                                        target=session.ev.target, kernels=kernels,
                                        budget=budget_text(session), shares=split)
