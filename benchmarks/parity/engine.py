"""Drive vLLM's real V1 ``Scheduler`` (or ``AsyncScheduler``) on a parity case, on CPU, no model.

Needs vLLM (see docs/validation.md): a ``VllmConfig`` whose model is a
tiny local ``config.json`` (no weights, no tokenizer, nothing downloaded) and a KV-cache config
that carries only the block count, as vLLM's own CPU tests build it. Each step calls
``schedule()`` and then ``update_from_output()`` with a synthetic sampled token for every
request that completed its prompt: the scheduler's decisions are all there is to compare.

The sync loop is ``EngineCore.step``: arrivals up to the current time join, one ``schedule()``,
its output. The async loop is ``EngineCore.step_with_batch_queue`` with two batches in flight:
the next batch is scheduled while the previous one runs, before its output is known. Every batch
that schedules tokens takes one unit of time on the (virtual) GPU; a ``schedule()`` call that
schedules nothing takes none, and its preemptions are reported with the next step that runs.
Besides the steps the recorder keeps their effects: the free blocks once each step's plan is
made (async: once the batch it overlapped has ended, as simsched's iteration log reads them),
the cached blocks evicted in each step and every request's ``num_preemptions``.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from benchmarks.parity.cases import MAX_MODEL_LEN, Case

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

# Token ids: prompt block h's j-th token is unique to (h, j); output tokens are unique to their
# request and position, and never collide with prompt tokens.
PROMPT_BASE = 1_000
OUTPUT_BASE = 1 << 40
MODEL_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
                "intermediate_size": 128, "num_attention_heads": 2, "num_hidden_layers": 1,
                "num_key_value_heads": 2, "vocab_size": 32000,
                "max_position_embeddings": 2 * MAX_MODEL_LEN, "torch_dtype": "float16"}


class StuckError(RuntimeError):
    """vLLM's scheduler made no progress (a case no engine could serve)."""


def vllm_version() -> str:
    """The installed vLLM's version."""
    import vllm

    return vllm.__version__


def _model_dir() -> str:
    path = Path(tempfile.gettempdir()) / "simsched-parity-model"
    path.mkdir(exist_ok=True)
    config = path / "config.json"
    if not config.exists():
        config.write_text(json.dumps(MODEL_CONFIG))
    return str(path)


def make_scheduler(case: Case):
    """vLLM's scheduler for ``case`` (``AsyncScheduler`` if the case is async)."""
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    sched_config = SchedulerConfig(
        max_model_len=MAX_MODEL_LEN, is_encoder_decoder=False,
        max_num_batched_tokens=case.max_num_batched_tokens, max_num_seqs=case.max_num_seqs,
        enable_chunked_prefill=True, long_prefill_token_threshold=0, policy=case.policy,
        scheduler_reserve_full_isl=case.reserve_full_isl, watermark=case.watermark,
        async_scheduling=case.async_scheduling)
    model_config = ModelConfig(model=_model_dir(), skip_tokenizer_init=True,
                               max_model_len=MAX_MODEL_LEN, dtype="float16", seed=0)
    cache_config = CacheConfig(block_size=case.block_size,
                               enable_prefix_caching=case.enable_prefix_caching)
    vllm_config = VllmConfig(scheduler_config=sched_config, model_config=model_config,
                             cache_config=cache_config)
    spec = FullAttentionSpec(block_size=case.block_size, num_kv_heads=1, head_size=1,
                             dtype=torch.float32)
    kv_config = KVCacheConfig(num_blocks=case.num_blocks, kv_cache_tensors=[],
                              kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    cache_config.num_gpu_blocks = case.num_blocks
    cls = AsyncScheduler if case.async_scheduling else Scheduler
    return cls(vllm_config=vllm_config, kv_cache_config=kv_config,
               structured_output_manager=StructuredOutputManager(vllm_config),
               block_size=case.block_size, log_stats=False)


def _prompt_tokens(req, hash_block_size: int) -> list[int]:
    tokens = []
    for h in req.hash_ids:
        start = PROMPT_BASE + h * hash_block_size
        tokens.extend(range(start, start + hash_block_size))
    return tokens[:req.num_prompt_tokens]


def make_requests(case: Case) -> list:
    """vLLM requests for the case's requests, ids zero-padded (vLLM breaks priority ties by id
    as strings)."""
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)
    hasher = get_request_block_hasher(case.block_size, sha256)
    out = []
    for i, r in enumerate(case.requests):
        params = SamplingParams(max_tokens=r.num_output_tokens, ignore_eos=True)
        out.append(Request(request_id=f"{i:06d}", prompt_token_ids=_prompt_tokens(
            r, case.hash_block_size), sampling_params=params, pooling_params=None,
            arrival_time=float(r.arrival), priority=r.priority, block_hasher=hasher))
    return out


class _Recorder:
    """Collects one case's steps in the comparison's form (see :mod:`benchmarks.parity.sim`)."""

    # What the model returns for a schedule (a subclass may sample more than one token).
    model_output = staticmethod(lambda sched, out, counts: _model_output(sched, out, counts))

    def __init__(self, sched) -> None:
        self.sched = sched
        self.steps: list = []
        self.preempted: list[int] = []
        self.free_blocks: list[int] = []
        self.evicted_blocks: list[int] = []     # cached blocks evicted, per step
        self.counts: dict[str, int] = {}
        # Count the block pool's evictions of cached blocks (its metrics collector only counts
        # them with log_stats on, which the recorder leaves off).
        pool = sched.kv_cache_manager.block_pool
        evict = pool._maybe_evict_cached_block
        self._evicted = 0

        def counted(block):
            evicted = evict(block)
            self._evicted += bool(evicted)
            return evicted

        pool._maybe_evict_cached_block = counted

    def schedule(self, now: int):
        sched = self.sched
        waiting = {rid for rid, r in sched.requests.items() if not r.is_finished()
                   and r.status.name in ("WAITING", "PREEMPTED")}
        out = sched.schedule()
        model_out = self.model_output(sched, out, self.counts)
        self.preempted.extend(int(rid) for rid in out.preempted_req_ids)
        if out.total_num_scheduled_tokens == 0:
            return out, model_out, None
        scheduled = []
        for rid, n in out.num_scheduled_tokens.items():
            cached = sched.requests[rid].num_computed_tokens - n if rid in waiting else 0
            scheduled.append([int(rid), int(n), int(cached)])
        step = [now, sorted(scheduled), sorted(set(self.preempted)), []]
        self.preempted = []
        self.steps.append(step)
        self.free_blocks.append(sched.kv_cache_manager.block_pool.get_num_free_blocks())
        self.evicted_blocks.append(self._evicted)
        self._evicted = 0
        return out, model_out, step


def _model_output(sched, out, counts: dict):
    """What the model would return for ``out``, made right after scheduling it: one new token
    for each request past its prompt (``counts``: tokens sampled per request so far)."""
    from vllm.v1.outputs import ModelRunnerOutput

    ids = list(out.num_scheduled_tokens)
    sampled = []
    for rid in ids:
        if sched.requests[rid].is_prefill_chunk:      # a prompt chunk that samples nothing
            sampled.append([])
            continue
        n = counts.get(rid, 0)
        counts[rid] = n + 1
        sampled.append([OUTPUT_BASE + int(rid) * MAX_MODEL_LEN + n])
    return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                             sampled_token_ids=sampled)


def _finished(outputs) -> list[int]:
    done = []
    for engine_outputs in outputs.values():
        done.extend(int(o.request_id) for o in engine_outputs.outputs
                    if o.finish_reason is not None)
    return done


def effects_of(rec: _Recorder, requests: list) -> dict:
    """What vLLM's decisions did besides the steps (see :func:`benchmarks.parity.compare.effects`):
    free blocks after each step's plan, cached blocks evicted in each step, each request's
    ``num_preemptions``."""
    return {"free_blocks": rec.free_blocks, "evicted_blocks": rec.evicted_blocks,
            "num_preemptions": [r.num_preemptions for r in requests]}


def run_vllm(case: Case, max_steps: int = 200_000) -> tuple[list, dict]:
    """vLLM's steps for ``case`` and their effects (:func:`effects_of`)."""
    sched = make_scheduler(case)
    requests = make_requests(case)
    rec = _Recorder(sched)
    run = _run_async if case.async_scheduling else _run_sync
    run(sched, requests, rec, max_steps)
    return rec.steps, effects_of(rec, requests)


def _arrive(sched, requests, nxt: int, now: int) -> int:
    while nxt < len(requests) and requests[nxt].arrival_time <= now:
        sched.add_request(requests[nxt])
        nxt += 1
    return nxt


def _run_sync(sched, requests, rec: _Recorder, max_steps: int) -> None:
    now = nxt = idle = 0
    for _ in range(max_steps):
        nxt = _arrive(sched, requests, nxt, now)
        if not sched.has_requests():
            if nxt == len(requests):
                return
            now = int(requests[nxt].arrival_time)
            continue
        out, model_out, step = rec.schedule(now)
        outputs = sched.update_from_output(out, model_out)
        if step is None:
            idle += 1
            if idle > 2 and sched.has_unfinished_requests():
                raise StuckError(f"vLLM scheduled nothing {idle} times in a row at t={now}")
            continue
        idle = 0
        step[3] = sorted(_finished(outputs))
        now += 1
    raise StuckError(f"over {max_steps} steps")


def _run_async(sched, requests, rec: _Recorder, max_steps: int) -> None:
    """``EngineCore.step_with_batch_queue`` with a batch queue of two and a virtual clock: a
    batch that schedules tokens runs for one unit after the previous one."""
    now = nxt = idle = 0
    gpu_free = 0                 # when the GPU finishes the batches queued so far
    queue: list = []             # (scheduler output, model output, step, end time), oldest first
    for _ in range(max_steps):
        nxt = _arrive(sched, requests, nxt, now)
        if sched.has_requests():
            out, model_out, step = rec.schedule(now)
            executed = step is not None
            if executed:
                start = max(now, gpu_free)
                gpu_free = start + 1
                step[0] = start
                queue.append((out, model_out, step, gpu_free))
                idle = 0
            else:
                queue.append((out, model_out, None, now))
                idle += 1
                if idle > 4 and sched.has_unfinished_requests():
                    raise StuckError(f"vLLM scheduled nothing {idle} times in a row at t={now}")
            if len(queue) < 2 and (executed or sched.has_requests()):
                continue
        elif not queue:
            if nxt == len(requests):
                return
            now = max(now, int(requests[nxt].arrival_time))
            continue
        out, model_out, step, end = queue.pop(0)
        now = max(now, end)
        outputs = sched.update_from_output(out, model_out)
        if step is not None:
            step[3] = sorted(_finished(outputs))
        if queue and queue[-1][2] is not None and queue[-1][2] is rec.steps[-1]:
            # The plan's blocks once the batch it overlapped has ended (its finished requests'
            # blocks back): as simsched's iteration log reads them.
            rec.free_blocks[-1] = sched.kv_cache_manager.block_pool.get_num_free_blocks()
    raise StuckError(f"over {max_steps} steps")
