"""Seeded parity cases: an engine's limits plus a small request list, in families.

A :class:`Case` is plain data (it round-trips through JSON, so recorded fixtures carry it):
vLLM's knobs (``num_blocks`` counts vLLM's reserved null block, as vLLM's ``num_gpu_blocks``
does), the scheduler's limits and requests that arrive at whole steps. Every request has
``hash_ids``: blocks of ``hash_block_size`` tokens named by integers, which give both engines the
same token identities (vLLM gets token ids derived from them, simsched the ids themselves), so
prefix-cache hits mean the same thing on both sides.

Families (:data:`FAMILIES`) stress one limit each: ``light`` (nothing binds), ``token_budget``
(chunked prefills), ``seq_bound`` (``max_num_seqs``), ``kv_bound`` (too few blocks),
``preemption_storm`` (many long decodes at once in a cache that fits few), ``shared_prefix`` (prefix caching with shared prompt heads, exact repeats and heavy
eviction), ``tiny_budget`` (token budgets down to 1), ``block_sizes`` (blocks of 1 to 64 tokens),
``priority`` (vLLM's priority policy), ``bursts`` (bursts of simultaneous arrivals into a tight
cache), ``async_storm`` (a preemption storm of short decodes that end close together, so victims
are often requests whose last token is still in flight), ``tiny_kv_priority`` (the priority
policy in a cache one or two requests fill, with prefix caching: victims already scheduled in
the step, re-admissions served from the cache) and ``long_context`` (contexts near
``max_model_len``, ``max_num_seqs`` often 1).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

FAMILIES = ("light", "token_budget", "seq_bound", "kv_bound", "preemption_storm",
            "shared_prefix", "tiny_budget", "block_sizes", "priority",
            # Issue 40's families: where async scheduling's in-flight finishes meet preemption.
            "bursts", "async_storm", "tiny_kv_priority", "long_context")
BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64)
MAX_MODEL_LEN = 4096          # the default model's context: every request fits well within it


@dataclass(frozen=True)
class Request:
    """One request: arrives at step ``arrival``; ``hash_ids`` cover its prompt."""

    arrival: int
    num_prompt_tokens: int
    num_output_tokens: int
    priority: int
    hash_ids: tuple


@dataclass(frozen=True)
class Case:
    """One parity case: the engine's limits (vLLM's names) and its requests."""

    case_id: int
    family: str
    block_size: int
    num_blocks: int               # vLLM's num_gpu_blocks: one of them is its null block
    max_num_seqs: int
    max_num_batched_tokens: int
    enable_prefix_caching: bool
    policy: str                   # "fcfs" or "priority"
    watermark: float
    reserve_full_isl: bool        # vLLM's scheduler_reserve_full_isl
    async_scheduling: bool
    hash_block_size: int
    requests: tuple = field(default_factory=tuple)

    def to_json(self) -> dict:
        """The case as JSON data (requests as lists, hash ids as runs ``[first, count]`` of
        consecutive ids)."""
        data = dataclasses.asdict(self)
        data["requests"] = [[r.arrival, r.num_prompt_tokens, r.num_output_tokens, r.priority,
                             _id_runs(r.hash_ids)] for r in self.requests]
        return data

    @classmethod
    def from_json(cls, data: dict) -> "Case":
        """The inverse of :meth:`to_json`."""
        reqs = tuple(Request(int(a), int(p), int(o), int(pr),
                             tuple(h for first, count in runs for h in range(first, first + count)))
                     for a, p, o, pr, runs in data["requests"])
        fields = {f.name for f in dataclasses.fields(cls)} - {"requests"}
        return cls(**{k: data[k] for k in fields}, requests=reqs)

    def label(self) -> str:
        """A one-line summary of the case's knobs."""
        knobs = [f"B={self.block_size}", f"blocks={self.num_blocks}",
                 f"seqs={self.max_num_seqs}", f"budget={self.max_num_batched_tokens}",
                 f"{len(self.requests)} requests"]
        if self.enable_prefix_caching:
            knobs.append(f"prefix caching (hash blocks of {self.hash_block_size})")
        if self.policy != "fcfs":
            knobs.append(self.policy)
        if self.watermark:
            knobs.append(f"watermark={self.watermark}")
        knobs.append("full-prompt admission" if self.reserve_full_isl else "first-chunk admission")
        if self.async_scheduling:
            knobs.append("async")
        return f"case {self.case_id} [{self.family}] " + ", ".join(knobs)


def _id_runs(ids) -> list:
    """``ids`` as runs ``[first, count]`` of consecutive integers."""
    runs: list = []
    for h in ids:
        if runs and runs[-1][0] + runs[-1][1] == h:
            runs[-1][1] += 1
        else:
            runs.append([int(h), 1])
    return runs


def _pick(rng: np.random.Generator, options):
    return options[int(rng.integers(len(options)))]


def _arrivals(rng: np.random.Generator, n: int) -> list[int]:
    kind = _pick(rng, ("together", "steady", "bursts", "sparse"))
    if kind == "together":
        return [0] * n
    if kind == "steady":
        gaps = rng.integers(0, 3, size=n)
    elif kind == "bursts":
        gaps = np.where(rng.random(n) < 0.2, rng.integers(5, 30, size=n), 0)
    else:
        gaps = rng.integers(0, 40, size=n)
    gaps[0] = 0
    return [int(x) for x in np.cumsum(gaps)]


def _lengths(rng, n, prompt: tuple, output: tuple, block_size: int) -> tuple[list, list]:
    prompts = rng.integers(prompt[0], prompt[1] + 1, size=n)
    # Some prompts end exactly at a block boundary (a fully cached prompt's special case).
    aligned = rng.random(n) < 0.25
    prompts = np.where(aligned, np.maximum(block_size, prompts // block_size * block_size), prompts)
    outputs = rng.integers(output[0], output[1] + 1, size=n)
    return [int(p) for p in prompts], [int(o) for o in outputs]


def _bursts(rng: np.random.Generator, n: int) -> list[int]:
    """2 to 5 bursts: every request of a burst arrives at the same step, bursts a few to many
    steps apart (some while the last burst still decodes)."""
    num_bursts = int(rng.integers(2, 6))
    starts = np.cumsum(rng.integers(1, 60, size=num_bursts)) - 1
    starts[0] = 0
    return sorted(int(starts[int(rng.integers(num_bursts))]) for _ in range(n))


def _ample_blocks(prompts, outputs, block_size: int) -> int:
    return sum(-(-(p + o) // block_size) for p, o in zip(prompts, outputs)) + 2


def _tight_blocks(rng, prompts, outputs, block_size: int) -> int:
    """Between the fewest blocks that still serve the largest request and twice that."""
    least = max(-(-(p + o) // block_size) for p, o in zip(prompts, outputs)) + 1
    return int(least + rng.integers(0, least + 1))


def _hash_ids(rng, prompts, hash_block_size: int, shared: bool) -> list[tuple]:
    """Each prompt's block ids: fresh ones, or (``shared``) heads of a few common chains, and
    some exact repeats of an earlier prompt."""
    next_id = [0]

    def fresh(k: int) -> list[int]:
        ids = list(range(next_id[0], next_id[0] + k))
        next_id[0] += k
        return ids

    chains = [fresh(int(rng.integers(1, 9))) for _ in range(int(rng.integers(1, 6)))] \
        if shared else []
    out: list[tuple] = []
    for i, p in enumerate(prompts):
        need = -(-p // hash_block_size)
        if shared and out and rng.random() < 0.2:
            j = int(rng.integers(len(out)))
            if len(out[j]) >= need:               # the same tokens as an earlier prompt's head
                out.append(out[j][:need])
                continue
        head = []
        if chains and rng.random() < 0.8:
            chain = _pick(rng, chains)
            head = chain[:int(rng.integers(1, len(chain) + 1))]
        ids = (head + fresh(max(0, need - len(head))))[:need]
        out.append(tuple(ids))
    return out


def make_case(case_id: int, seed: int = 0, family: str | None = None,
              async_scheduling: bool = False) -> Case:
    """Case ``case_id`` of the seeded sequence (its family cycles through :data:`FAMILIES`
    unless given)."""
    rng = np.random.default_rng([seed, case_id])
    family = family or FAMILIES[case_id % len(FAMILIES)]
    block_size = _pick(rng, BLOCK_SIZES) if family == "block_sizes" \
        else _pick(rng, (16, 16, 16, 4, 8, 32))
    seqs, budget = int(rng.integers(4, 33)), int(rng.integers(64, 1025))
    prompt, output, n = (1, 300), (1, 60), int(rng.integers(6, 25))
    tight = False
    if family == "light":
        n, seqs, budget = int(rng.integers(2, 9)), int(rng.integers(8, 65)), 2048
        prompt, output = (1, 200), (1, 40)
    elif family == "token_budget":
        seqs = int(rng.integers(2, 17))
        budget = max(seqs, int(rng.integers(8, 65)))
        prompt, output = (20, 600), (1, 30)
    elif family == "seq_bound":
        seqs, n = int(rng.integers(1, 5)), int(rng.integers(10, 31))
        prompt, output = (1, 100), (5, 60)
    elif family in ("kv_bound", "priority"):
        prompt, output = (10, 300), (20, 120)
        tight = True
    elif family == "preemption_storm":
        n, seqs, budget = int(rng.integers(16, 31)), int(rng.integers(16, 65)), 1024
        prompt, output = (10, 120), (60, 200)
    elif family == "shared_prefix":
        prompt, output = (1, 400), (1, 40)
        tight = rng.random() < 0.7
    elif family == "tiny_budget":
        budget = int(rng.integers(1, 9))
        seqs, n = int(rng.integers(1, budget + 1)), int(rng.integers(3, 11))
        prompt, output = (1, 60), (1, 20)
    elif family == "block_sizes":
        tight = rng.random() < 0.6
    elif family == "bursts":
        n, seqs = int(rng.integers(12, 41)), int(rng.integers(4, 49))
        prompt, output = (1, 250), (1, 80)
        tight = rng.random() < 0.8
    elif family == "async_storm":
        n, seqs, budget = int(rng.integers(10, 31)), int(rng.integers(8, 65)), 1024
        prompt, output = (4, 80), (2, 24)
    elif family == "tiny_kv_priority":
        block_size = _pick(rng, (2, 4, 8, 16))
        n, prompt, output = int(rng.integers(6, 19)), (4, 120), (2, 60)
    elif family == "long_context":
        n = int(rng.integers(2, 7))
        seqs = 1 if rng.random() < 0.5 else int(rng.integers(2, 5))
        budget = int(_pick(rng, (256, 512, 1024, 2048, 4096)))
        prompt, output = (MAX_MODEL_LEN - 900, MAX_MODEL_LEN - 40), (1, 40)
        tight = rng.random() < 0.5
    prompts, outputs = _lengths(rng, n, prompt, output, block_size)
    if family == "long_context":
        # Up to max_model_len exactly (prompt + output), never past it.
        outputs = [max(1, min(o, MAX_MODEL_LEN - p)) for p, o in zip(prompts, outputs)]
    if family in ("preemption_storm", "async_storm"):
        least = max(-(-(p + o) // block_size) for p, o in zip(prompts, outputs)) + 1
        blocks = int(least + rng.integers(0, least // 2 + 1))
    elif family == "tiny_kv_priority":
        least = max(-(-(p + o) // block_size) for p, o in zip(prompts, outputs)) + 1
        blocks = int(least + rng.integers(0, 4))
    elif tight:
        blocks = _tight_blocks(rng, prompts, outputs, block_size)
    else:
        blocks = _ample_blocks(prompts, outputs, block_size)
    prefix = family == "shared_prefix" or bool(rng.random() < (0.8 if family == "tiny_kv_priority"
                                                                 else 0.5))
    hash_block_size = _pick(rng, (block_size, block_size, max(1, block_size // 2),
                                  2 * block_size, int(rng.integers(1, 33))))
    hashes = _hash_ids(rng, prompts, hash_block_size, prefix and rng.random() < 0.8
                       or family == "shared_prefix")
    policy = "priority" if family in ("priority", "tiny_kv_priority") or rng.random() < 0.1 \
        else "fcfs"
    priorities = rng.integers(0, 4, size=n) if policy == "priority" else np.zeros(n, dtype=int)
    watermark = 0.0
    if rng.random() < 0.4:
        # A round fraction, or k blocks of vLLM's pool exactly: vLLM rounds w * (blocks + 1)
        # (its null block included), so these are where the rounding decides.
        watermark = float(_pick(rng, (0.01, 0.02, 0.05, 0.1))) if rng.random() < 0.5 \
            else int(rng.integers(1, 4)) / (blocks + 1)
        if watermark > 0.5:         # a cache of a few blocks: past what either engine accepts
            watermark = 0.0
    if family == "preemption_storm":
        arrivals = [0] * n
    elif family == "bursts":
        arrivals = _bursts(rng, n)
    elif family == "async_storm":
        # Two waves: the second arrives as the first's short decodes end.
        arrivals = [0 if rng.random() < 0.6 else int(rng.integers(10, 40)) for _ in range(n)]
        arrivals.sort()
    else:
        arrivals = _arrivals(rng, n)
    reqs = tuple(Request(a, p, o, int(pr), ids) for a, p, o, pr, ids
                 in zip(arrivals, prompts, outputs, priorities, hashes))
    return Case(case_id=case_id, family=family, block_size=block_size,
                num_blocks=blocks + 1, max_num_seqs=seqs, max_num_batched_tokens=budget,
                enable_prefix_caching=prefix, policy=policy, watermark=watermark,
                reserve_full_isl=bool(rng.random() < 0.6), async_scheduling=async_scheduling,
                hash_block_size=hash_block_size, requests=reqs)


def make_cases(num_cases: int, seed: int = 0, start: int = 0,
               async_scheduling: bool = False) -> list[Case]:
    """Cases ``start .. start + num_cases - 1`` of the seeded sequence."""
    return [make_case(i, seed, async_scheduling=async_scheduling)
            for i in range(start, start + num_cases)]
