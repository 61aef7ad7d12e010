"""Closed-loop multi-turn sessions: each session is a SimPy process sending one turn at a time.

A session sends turn ``k+1`` only after turn ``k`` has finished plus the turn's think time, so the
load reacts to latency (a slow server gets fewer requests). Turn ``k+1``'s prompt is the whole
history (every earlier prompt and output) plus new user tokens; its
:class:`~simsched.request.Content` chains the history's keys and turn ``k``'s output key, so a
prefix cache serves it from the blocks turn ``k`` left behind, generated tokens included.

Requests are created when they arrive and appended to the cluster's request list, so ids stay
unique, in arrival order, and the results frame holds every turn. A turn that is rejected (for
example because the history outgrew the model's context) ends its session.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from simsched.request import Content, Request, Status
from simsched.workloads.hash_ids import merged_hash_segments, parse_hash_ids

# Content-id namespaces (ints and int tuples only: their hashes are the same in every process).
SYSTEM_PROMPT, UNIQUE, USER, OUTPUT = 1, 2, 3, 4


class Turn:
    """One planned turn: lengths, labels, think time before it and optional trace segments.

    ``segments`` (from a trace's ``hash_ids``) name the whole prompt; without them the prompt is
    the session's history plus new user tokens.
    """

    __slots__ = ("num_prompt_tokens", "num_output_tokens", "priority", "tenant", "think_time",
                 "segments")

    def __init__(self, num_prompt_tokens: int, num_output_tokens: int, priority: int = 0,
                 tenant=None, think_time: float = 0.0, segments=None) -> None:
        self.num_prompt_tokens = num_prompt_tokens
        self.num_output_tokens = num_output_tokens
        self.priority = priority
        self.tenant = tenant
        self.think_time = think_time
        self.segments = segments


class SessionPlan:
    """A session: its id, start time, optional shared system prompt and its turns in order."""

    __slots__ = ("session_id", "start_at", "prefix_group", "prefix_len", "turns")

    def __init__(self, session_id: int, start_at: float, turns: list, prefix_group: int = -1,
                 prefix_len: int = 0) -> None:
        self.session_id = session_id
        self.start_at = start_at
        self.turns = turns
        self.prefix_group = prefix_group
        self.prefix_len = prefix_len


def is_closed_loop(table: pd.DataFrame) -> bool:
    """Whether a table describes closed-loop sessions (it has ``session_id`` and ``think_time``)."""
    return "session_id" in table.columns and "think_time" in table.columns


def build_sessions(table: pd.DataFrame, hash_block_size: int = 512) -> list[SessionPlan]:
    """Group a closed-loop table's rows into sessions (turns in row order), by start time.

    A session starts at its first row's ``arrival_at``; later rows' times are not used. Without
    ``hash_ids``, turn ``k+1`` must be longer than turn ``k``'s prompt plus output (the new user
    tokens are the difference); ValueError names the session and turn otherwise.
    """
    def column(name, default):
        return table[name].tolist() if name in table.columns else [default] * len(table)

    sid = table["session_id"].to_numpy()
    if (sid < 0).any():
        raise ValueError(f"requests[{int(np.argmax(sid < 0))}].session_id: every row of a "
                         "closed-loop table (with think_time) needs a session_id >= 0")
    think = table["think_time"].to_numpy(dtype=float)
    bad = ~np.isfinite(think) | (think < 0)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"requests[{i}].think_time must be a number of seconds >= 0, "
                         f"got {think[i]!r}")
    arrival = table["arrival_at"].to_numpy(dtype=float)
    prompt = table["num_prompt_tokens"].to_numpy()
    output = table["num_output_tokens"].to_numpy()
    priority, tenant = column("priority", 0), column("tenant", None)
    hashes, group = column("hash_ids", None), column("prefix_group", -1)
    prefix_len = column("prefix_len", 0)
    raw = hashes
    hashes = [None if h is None or (isinstance(h, float) and h != h) else parse_hash_ids(h)
              for h in raw]
    for i, (ids, p) in enumerate(zip(hashes, prompt)):
        if ids is None and raw[i] is not None and not isinstance(raw[i], float):
            raise ValueError(f"requests[{i}].hash_ids must be a non-empty list of integers >= 0, "
                             f"got {raw[i]!r}")
        if ids is not None and len(ids) < -(-int(p) // hash_block_size):
            raise ValueError(f"requests[{i}].hash_ids: {len(ids)} ids cannot cover a {p}-token "
                             f"prompt in blocks of {hash_block_size} tokens")
    hashes = merged_hash_segments(hashes, prompt, hash_block_size)
    plans: dict[int, SessionPlan] = {}
    for i, s in enumerate(sid.tolist()):
        ids = segments = hashes[i]
        turn = Turn(int(prompt[i]), int(output[i]), int(priority[i] or 0),
                    None if tenant[i] != tenant[i] else tenant[i], float(think[i]), segments)
        plan = plans.get(s)
        if plan is None:
            g = group[i]
            g = -1 if g is None or g != g else int(g)
            plans[s] = SessionPlan(s, float(arrival[i]), [turn], g,
                                   int(prefix_len[i] or 0) if g >= 0 else 0)
            continue
        prev = plan.turns[-1]
        if ids is None and turn.num_prompt_tokens <= prev.num_prompt_tokens \
                + prev.num_output_tokens:
            raise ValueError(
                f"requests[{i}]: turn {len(plan.turns)} of session {s} has a "
                f"{turn.num_prompt_tokens}-token prompt, not longer than the previous turn's "
                f"prompt + output ({prev.num_prompt_tokens} + {prev.num_output_tokens}) it "
                "must repeat")
        plan.turns.append(turn)
    return sorted(plans.values(), key=lambda p: (p.start_at, p.session_id))


def turn_content(plan: SessionPlan, k: int, prev: Request | None) -> Content:
    """Content identity of turn ``k`` of ``plan`` (``prev``: turn ``k-1``, finished)."""
    turn, sid = plan.turns[k], plan.session_id
    out = (OUTPUT, sid, k)
    if turn.segments is not None:
        return Content.from_segments(turn.segments, out, sid)
    if k == 0 or prev is None:
        shared = min(plan.prefix_len, turn.num_prompt_tokens)
        segments = [((SYSTEM_PROMPT, plan.prefix_group), shared)] if shared else []
        segments.append(((USER, sid, 0), turn.num_prompt_tokens - shared))
        return Content.from_segments(segments, out, sid)
    before = plan.turns[k - 1]
    new = turn.num_prompt_tokens - before.num_prompt_tokens - before.num_output_tokens
    return Content.from_segments([((USER, sid, k), new)], out, sid, parent=prev.content,
                                 num_parent_output=before.num_output_tokens)


def run_sessions(cluster, plans: list[SessionPlan]):
    """SimPy process: start each session's process at its start time."""
    env = cluster.env
    for plan in plans:
        delay = plan.start_at - env.now
        if delay > 0:
            yield env.timeout(delay)
        env.process(_session(cluster, plan))


def _session(cluster, plan: SessionPlan):
    """One session: its turns, then (in an autoscaled run) word that it is closed."""
    yield from _turns(cluster, plan)
    work_end = getattr(cluster, "work_end", None)
    if work_end is not None:
        work_end.session_ended()


def _turns(cluster, plan: SessionPlan):
    """Send a turn, wait for it to finish, think, send the next."""
    env = cluster.env
    prev = None
    for k, turn in enumerate(plan.turns):
        if k and turn.think_time > 0:
            yield env.timeout(turn.think_time)
        content = turn_content(plan, k, prev)
        req = Request(len(cluster.requests), env.now, turn.num_prompt_tokens,
                      turn.num_output_tokens, turn.priority, turn.tenant, content)
        cluster.requests.append(req)
        yield env.process(cluster._request(req))
        if req.status is not Status.FINISHED:
            clients = getattr(cluster, "clients", None)
            if clients is None or req.status is Status.REJECTED \
                    or clients.cfg.session_on_failure == "stop":
                if clients is None or not clients.succeeded(req.id):
                    return      # rejected (or failed): the conversation cannot go on
        prev = req
