"""Line two engines' steps up and say where they part (steps as :mod:`benchmarks.parity.sim`
describes them), and pack steps compactly for the recorded fixtures."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Outcome:
    """How one case compared: steps in each run, steps equal at the same index, the first index
    where they differ (None if identical) and a readable account of it."""

    num_steps: int
    num_same: int
    first_diff: int | None
    diff: str

    @property
    def identical(self) -> bool:
        return self.first_diff is None


def _describe(step) -> dict:
    if step is None:
        return {}
    return {"time": step[0], "scheduled": {r: (n, c) for r, n, c in step[1]},
            "preempted": set(step[2]), "finished": set(step[3])}


def explain(vllm_step, sim_step, names=("vLLM", "simsched")) -> str:
    """What differs between two steps at the same index, request by request."""
    a, b = _describe(vllm_step), _describe(sim_step)
    if not a or not b:
        ran = names[1] if not a else names[0]
        other = names[0] if not a else names[1]
        step = sim_step if not a else vllm_step
        return f"{ran} runs one more step (t={step[0]}: {step[1]}), {other} has ended"
    lines = []
    if a["time"] != b["time"]:
        lines.append(f"  time: {names[0]} t={a['time']}, {names[1]} t={b['time']}")
    for rid in sorted(set(a["scheduled"]) | set(b["scheduled"])):
        x, y = a["scheduled"].get(rid), b["scheduled"].get(rid)
        if x != y:
            def fmt(v):
                if v is None:
                    return "not scheduled"
                return f"{v[0]} tokens" + (f" ({v[1]} from the prefix cache)" if v[1] else "")
            lines.append(f"  request {rid}: {names[0]} {fmt(x)}, {names[1]} {fmt(y)}")
    for key in ("preempted", "finished"):
        if a[key] != b[key]:
            lines.append(f"  {key}: {names[0]} {sorted(a[key])}, {names[1]} {sorted(b[key])}")
    return "\n".join(lines)


def compare(vllm_steps: list, sim_steps: list) -> Outcome:
    """Compare two runs step by step (by index: a step is one schedule that ran tokens)."""
    n = max(len(vllm_steps), len(sim_steps))
    same = sum(1 for a, b in zip(vllm_steps, sim_steps) if a == b)
    first = next((i for i in range(n) if i >= len(vllm_steps) or i >= len(sim_steps)
                  or vllm_steps[i] != sim_steps[i]), None)
    if first is None:
        return Outcome(n, same, None, "")
    get = lambda steps: steps[first] if first < len(steps) else None  # noqa: E731
    before = vllm_steps[first - 1] if first else None
    text = (f"first difference at step {first}"
            + (f" (t={get(vllm_steps)[0]})" if get(vllm_steps) else "") + ":\n"
            + explain(get(vllm_steps), get(sim_steps)))
    if before is not None:
        text += f"\n  the step before (identical): t={before[0]}, scheduled {before[1]}"
    return Outcome(n, same, first, text)


def pack(steps: list) -> list:
    """Run-length pack a step list: consecutive steps one unit of time apart with the same
    decisions become one ``[time, count, scheduled, preempted, finished]``."""
    out: list = []
    for t, scheduled, preempted, finished in steps:
        last = out[-1] if out else None
        if last is not None and last[0] + last[1] == t and last[2] == scheduled \
                and last[3] == preempted and last[4] == finished:
            last[1] += 1
        else:
            out.append([t, 1, scheduled, preempted, finished])
    return out


def unpack(runs: list) -> list:
    """The inverse of :func:`pack`."""
    return [[t + i, scheduled, preempted, finished]
            for t, count, scheduled, preempted, finished in runs for i in range(count)]


EFFECTS = ("free_blocks", "evicted_blocks", "num_preemptions")


def effects(vllm_effects: dict, sim_effects: dict) -> str:
    """Where two runs' effects (free blocks per step, evicted blocks per step, preemptions per
    request) first differ, or "" if they agree."""
    for key in EFFECTS:
        a, b = vllm_effects[key], sim_effects[key]
        if a != b:
            i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            what = "request" if key == "num_preemptions" else "step"
            x = a[i] if i < len(a) else "none"
            y = b[i] if i < len(b) else "none"
            return f"  {key}: at {what} {i}, vLLM {x}, simsched {y} ({len(a)} vs {len(b)} values)"
    return ""


def pack_effects(eff: dict) -> dict:
    """Effects compactly for fixtures: free blocks as runs ``[value, count]``, evictions as
    ``[step, count]`` where non-zero, preemptions per request as they are."""
    runs: list = []
    for v in eff["free_blocks"]:
        if runs and runs[-1][0] == v:
            runs[-1][1] += 1
        else:
            runs.append([v, 1])
    return {"free_blocks": runs,
            "evicted_blocks": [[i, n] for i, n in enumerate(eff["evicted_blocks"]) if n],
            "num_steps": len(eff["evicted_blocks"]), "num_preemptions": eff["num_preemptions"]}


def unpack_effects(data: dict) -> dict:
    """The inverse of :func:`pack_effects`."""
    evicted = [0] * data["num_steps"]
    for i, n in data["evicted_blocks"]:
        evicted[i] = n
    return {"free_blocks": [v for v, n in data["free_blocks"] for _ in range(n)],
            "evicted_blocks": evicted, "num_preemptions": data["num_preemptions"]}
