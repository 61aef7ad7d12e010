"""Seeded scheduling cases for the SGLang parity check (stdlib only: both venvs import it).

A case is JSON data: the engine's limits (token pool, chunked prefill size, max prefill tokens,
max running requests, schedule policy, radix cache on or off) and requests, each a prompt of
named segments (equal names at equal positions are equal tokens), an output length and the
number of batches run before it arrives. Families:

* ``light``: few short requests, ample memory, no queueing;
* ``budget``: long prompts against a small chunked-prefill size and ``max_prefill_tokens``;
* ``kv_retract``: a small token pool and long outputs, so admissions by the decayed
  ``new_token_ratio`` overrun memory and decodes are retracted;
* ``prefix_evict``: requests sharing system prompts and documents in a pool too small to keep
  them all, so the radix tree evicts leaves; ``lpm`` / ``dfs-weight`` policies;
* ``mixed``: ``--enable-mixed-chunk``: requests arriving while others decode, small prefill
  budgets and chunks that the running decodes eat into, a pool tight enough to refuse and
  retract.
"""

from __future__ import annotations

import random

FAMILIES = ("light", "budget", "kv_retract", "prefix_evict", "mixed")


def make_case(family: str, seed: int) -> dict:
    """The case of ``family`` drawn with ``seed``."""
    rng = random.Random(f"{family}-{seed}")
    policy = rng.choice(["fcfs", "lpm", "dfs-weight", "lof"])
    case = {"family": family, "seed": seed, "policy": policy, "radix": True,
            "chunked_prefill_size": 8192, "max_prefill_tokens": 16384,
            "max_running_requests": 64, "num_tokens": 100_000}
    requests = []
    if family == "light":
        n = rng.randint(2, 8)
        for i in range(n):
            requests.append(_req(i, [[f"u{i}", rng.randint(1, 200)]], rng.randint(1, 40),
                                 rng.randint(0, 30)))
        case["radix"] = rng.random() < 0.8
    elif family == "budget":
        case.update(chunked_prefill_size=rng.choice([64, 128, 256]),
                    max_prefill_tokens=rng.choice([256, 512, 1024]),
                    max_running_requests=rng.choice([4, 8, 16]))
        for i in range(rng.randint(6, 16)):
            requests.append(_req(i, [[f"u{i}", rng.randint(20, 900)]], rng.randint(1, 30),
                                 rng.randint(0, 40)))
    elif family == "kv_retract":
        case.update(num_tokens=rng.randint(600, 1500), chunked_prefill_size=rng.choice([128, 512]),
                    max_running_requests=rng.choice([8, 16, 32]))
        for i in range(rng.randint(10, 24)):
            requests.append(_req(i, [[f"u{i}", rng.randint(10, 150)]], rng.randint(50, 300),
                                 rng.randint(0, 400)))
    elif family == "mixed":
        case.update(mixed_chunk=True, num_tokens=rng.randint(800, 3000),
                    chunked_prefill_size=rng.choice([64, 128, 512]),
                    max_prefill_tokens=rng.choice([128, 256, 1024]),
                    max_running_requests=rng.choice([8, 16, 32]))
        for i in range(rng.randint(8, 24)):
            requests.append(_req(i, [[f"u{i}", rng.randint(10, 400)]], rng.randint(20, 300),
                                 rng.randint(0, 200)))
    else:
        case.update(num_tokens=rng.randint(800, 2500), chunked_prefill_size=rng.choice([128, 256, 512]),
                    max_running_requests=rng.choice([4, 8, 16]),
                    policy=rng.choice(["lpm", "dfs-weight", "fcfs"]))
        docs = [f"doc{k}" for k in range(rng.randint(2, 5))]
        for i in range(rng.randint(8, 24)):
            segments = [[f"sys{rng.randint(0, 1)}", rng.randint(30, 80)]]
            if rng.random() < 0.7:
                segments.append([rng.choice(docs), rng.randint(40, 200)])
            segments.append([f"q{i}", rng.randint(5, 60)])
            requests.append(_req(i, segments, rng.randint(1, 60), rng.randint(0, 120)))
    requests.sort(key=lambda r: (r["arrival_step"], r["id"]))
    case["requests"] = requests
    return case


def _req(i: int, segments: list, output: int, arrival_step: int) -> dict:
    return {"id": i, "segments": segments, "output": output, "arrival_step": arrival_step}


def cases(n: int) -> list[dict]:
    """``n`` cases, the families in turn."""
    return [make_case(FAMILIES[k % len(FAMILIES)], k // len(FAMILIES)) for k in range(n)]


def segment_chains(segments: list) -> list[tuple]:
    """Each segment's identity: the names of every segment up to it and its start."""
    out, names, start = [], [], 0
    for name, n in segments:
        names.append(name)
        out.append((tuple(names), start, n))
        start += n
    return out
