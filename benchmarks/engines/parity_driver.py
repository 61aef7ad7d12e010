"""Drive SGLang 0.5.9's own scheduling classes on CPU, no model: the reference side of parity.

Run in a venv with SGLang (never simsched's): ``.venv-sglang/bin/python -m
benchmarks.engines.parity_driver --cases 1000 --out traces.json``. SGLang's ``RadixCache``
(``mem_cache/radix_cache.py``), ``PrefillAdder`` and ``SchedulePolicy``
(``managers/schedule_policy.py``) run as they are, on a token pool of CPU tensors; the GPU-only
extension ``sgl_kernel`` is replaced by an empty stand-in (the scheduling classes import it but
never call it) and the global server arguments by ``ServerArgs``' defaults. The loop around them
is ``Scheduler.get_next_batch_to_run`` / ``get_new_batch_prefill`` / ``update_running_batch``
and ``ScheduleBatch.check_decode_mem`` / ``retract_decode``, and the result processing of
``process_batch_result_prefill`` / ``_decode``, written here step for step after
``managers/scheduler.py`` and ``managers/schedule_batch.py``: those need a model runner, GPU
batches and processes, so they are checked against SGLang's code, not run.

Each batch that runs is recorded: its kind, the requests it runs with their new tokens, the
cached prefix each prefill starts from, and the requests a decode step retracted.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.machinery
import json
import sys
import types
import warnings

from benchmarks.engines.parity_cases import cases, segment_chains


class _Any(types.ModuleType):
    """A stand-in for a GPU-only extension: every attribute is another stand-in."""

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        full = f"{self.__name__}.{name}"
        mod = sys.modules.get(full) or _Any(full)
        sys.modules[full] = mod
        return mod

    def __call__(self, *args, **kwargs):
        return self


class _StandIns:
    def __init__(self, roots):
        self.roots = roots

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Any(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def _import_sglang():
    sys.meta_path.insert(0, _StandIns({"sgl_kernel", "common_ops"}))
    warnings.simplefilter("ignore")
    import sglang.srt.server_args as sa
    from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder, SchedulePolicy
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey

    class _Args:
        def __getattr__(self, name):
            return getattr(sa.ServerArgs, name, None)

    sa.set_global_server_args_for_scheduler(_Args())
    return AddReqResult, PrefillAdder, SchedulePolicy, CacheInitParams, RadixCache, RadixKey


def token(chain: tuple, pos: int) -> int:
    """A token id for position ``pos`` of the segment named ``chain`` (64-bit, stable)."""
    digest = hashlib.blake2b(repr((chain, pos)).encode(), digest_size=7).digest()
    return int.from_bytes(digest, "big") + 1


def run_case(case: dict, sgl) -> list[dict]:
    """The batches SGLang's scheduler runs on ``case`` (module docstring)."""
    import torch

    AddReqResult, PrefillAdder, SchedulePolicy, CacheInitParams, RadixCache, RadixKey = sgl

    class Alloc:
        page_size = 1
        device = "cpu"

        def __init__(self, n):
            self.free_slots = list(range(1, n + 1))

        def available_size(self):
            return len(self.free_slots)

        def alloc(self, n):
            if n > len(self.free_slots):
                return None
            out, self.free_slots = self.free_slots[:n], self.free_slots[n:]
            return torch.tensor(out, dtype=torch.int64)

        def free(self, t):
            if t is not None and len(t):
                self.free_slots.extend(t.tolist())

    class Pool:
        def __init__(self, rows, cols):
            self.req_to_token = torch.zeros((rows, cols), dtype=torch.int64)
            self.free_rows = list(range(rows))

        def write(self, idx, values):
            self.req_to_token[idx] = values

    class Req:
        def __init__(self, spec):
            self.rid = spec["id"]
            self.origin_input_ids = [token(c, s + p) for c, s, n in
                                     segment_chains(spec["segments"]) for p in range(n)]
            self.out_tokens = [token(("out", self.rid), p) for p in range(spec["output"])]
            self.output_ids = []
            self.sampling_params = types.SimpleNamespace(max_new_tokens=spec["output"],
                                                         ignore_eos=False)
            self.extra_key = self.cache_salt = self.priority = self.lora_id = None
            self.prefix_indices = torch.empty((0,), dtype=torch.int64)
            self.last_node = self.last_host_node = None
            self.host_hit_length = 0
            self.extend_input_len = 0
            self.fill_ids = []
            self.req_pool_idx = None
            self.cache_protected_len = 0
            self.is_chunked = 0
            self.kv_committed_len = 0
            self.return_logprob = False
            self.swa_uuid_for_lock = None

        def set_extend_input_len(self, n):
            self.extend_input_len = n

        def pop_committed_kv_cache(self):
            return self.kv_committed_len

        def finished(self):
            return len(self.output_ids) >= self.sampling_params.max_new_tokens

        def init_next_round_input(self, tree_cache=None):
            """Req.init_next_round_input (page size 1, no logprobs)."""
            self.fill_ids = self.origin_input_ids + self.output_ids
            max_prefix_len = max(len(self.fill_ids) - 1, 0)
            if tree_cache is not None:
                from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
                m = tree_cache.match_prefix(MatchPrefixParams(
                    key=RadixKey(token_ids=self.fill_ids[:max_prefix_len], extra_key=None)))
                self.prefix_indices, self.last_node = m.device_indices, m.last_device_node
                self.last_host_node, self.host_hit_length = m.last_host_node, m.host_hit_length
                self.cache_protected_len = len(self.prefix_indices)
            self.extend_input_len = len(self.fill_ids) - len(self.prefix_indices)

    num_tokens = case["num_tokens"]
    alloc = Alloc(num_tokens)
    max_len = max(sum(n for _, n in r["segments"]) + r["output"] for r in case["requests"]) + 2
    pool = Pool(case["max_running_requests"] + 4, max_len)
    tree = RadixCache(CacheInitParams(disable=not case["radix"], req_to_token_pool=pool,
                                      token_to_kv_pool_allocator=alloc, page_size=1))
    policy = SchedulePolicy(case["policy"], tree, False, False, False)
    init_ratio = min(0.7 * 1.0, 1.0)
    min_ratio = min(init_ratio * 0.14, 1.0)
    decay = (init_ratio - min_ratio) / 600
    st = types.SimpleNamespace(ratio=init_ratio, waiting=[], running=[], chunked=None,
                               full=False, last=None, last_kind=None)
    chunk_size = case["chunked_prefill_size"]
    max_running = case["max_running_requests"]
    mixed = case.get("mixed_chunk", False)
    pending = [Req(r) for r in case["requests"]]
    arrival = {r["id"]: r["arrival_step"] for r in case["requests"]}
    trace: list[dict] = []

    def evict(n):
        if not tree.disable and alloc.available_size() < n:
            from sglang.srt.mem_cache.base_prefix_cache import EvictParams
            tree.evict(EvictParams(num_tokens=n))

    def release(req, is_insert=True):
        tree.cache_finished_req(req, is_insert=is_insert)
        pool.free_rows.append(req.req_pool_idx)
        req.req_pool_idx = None

    def get_new_batch_prefill():
        if (st.full or not st.waiting) and st.chunked is None:
            return None
        running_bs = len(st.running)
        if max_running - running_bs <= 0 and st.chunked is not None:
            st.full = True
            return None
        policy.calc_priority(st.waiting, types.SimpleNamespace(reqs=st.running))
        adder = PrefillAdder(1, tree, alloc, types.SimpleNamespace(reqs=st.running), st.ratio,
                             case["max_prefill_tokens"], chunk_size,
                             running_bs if mixed else 0)
        if st.chunked is not None:
            st.chunked.init_next_round_input()
            st.chunked = adder.add_chunked_req(st.chunked)
        for req in st.waiting:
            if len(adder.can_run_list) >= max_running - running_bs:
                st.full = True
            if st.full:
                break
            req.init_next_round_input(tree)
            res = adder.add_one_req(req, has_chunked_req=st.chunked is not None,
                                    truncation_align_size=None)
            if res != AddReqResult.CONTINUE:
                if res == AddReqResult.NO_TOKEN:
                    st.full = True
                break
        can_run = adder.can_run_list
        if not can_run:
            return None
        ids = {id(r) for r in can_run}
        st.waiting = [r for r in st.waiting if id(r) not in ids]
        if adder.new_chunked_req is not None:
            st.chunked = adder.new_chunked_req
        if st.chunked is not None:
            st.chunked.is_chunked += 1
        # prepare_for_extend: request slots, then every new token at once.
        record = {"kind": "prefill", "run": [], "cached": []}
        for r in can_run:
            if r.req_pool_idx is None:
                r.req_pool_idx = pool.free_rows.pop(0)
        total = sum(r.extend_input_len for r in can_run)
        evict(total)
        locs = alloc.alloc(total)
        assert locs is not None, "out of memory in prefill"
        off = 0
        for r in can_run:
            pre = len(r.prefix_indices)
            n = r.extend_input_len
            pool.req_to_token[r.req_pool_idx, :pre] = r.prefix_indices
            pool.req_to_token[r.req_pool_idx, pre:pre + n] = locs[off:off + n]
            off += n
            r.kv_committed_len = pre + n
            record["run"].append([r.rid, n])
            record["cached"].append([r.rid, pre])
        batch = list(can_run)
        if mixed and st.running:
            # Mixed-style chunked prefill: filter_batch, prepare_for_decode (alloc_token_slots
            # evicts first), mix_with_running; the running batch is left empty.
            st.running = [r for r in st.running if not r.finished()]
            if st.running:
                prepare_for_decode(st.running, "a mixed decode")
                record["decode"] = sorted(r.rid for r in st.running)
                batch += st.running
            st.running = []
        return batch, record

    def retract_decode():
        reqs = st.running
        order = sorted(range(len(reqs)), key=lambda i: (len(reqs[i].output_ids),
                                                         -len(reqs[i].origin_input_ids)),
                       reverse=True)
        out = []
        first = True
        while first or not check_decode_mem(len(order)):
            if len(order) == 1:
                break
            first = False
            req = reqs[order.pop()]
            out.append(req)
            release(req, is_insert=False)          # release_req
            evict(len(order) * 20)
            req.prefix_indices = torch.empty((0,), dtype=torch.int64)
            req.last_node = None
            req.extend_input_len = 0
            req.is_chunked = 0
            req.kv_committed_len = 0
        st.running = [reqs[i] for i in order]       # filter_batch(keep_indices=...)
        decoded = sum(len(r.output_ids) for r in st.running)
        max_new = sum(r.sampling_params.max_new_tokens for r in st.running)
        return out, min(1.0, (decoded + 20 * len(st.running)) / (max_new + 1))

    def prepare_for_decode(reqs, what):
        """One new token slot per request (alloc_token_slots evicts first)."""
        evict(len(reqs))
        locs = alloc.alloc(len(reqs))
        assert locs is not None, f"out of memory in {what}"
        for r, loc in zip(reqs, locs.tolist()):
            pool.req_to_token[r.req_pool_idx, r.kv_committed_len] = loc
            r.kv_committed_len += 1

    def check_decode_mem(n):
        evict(n)
        return alloc.available_size() >= n

    batches = 0
    for _ in range(100_000):
        while pending and arrival[pending[0].rid] <= batches:
            st.waiting.append(pending.pop(0))
        # get_next_batch_to_run
        if st.chunked is not None:
            tree.cache_unfinished_req(st.chunked, chunked=True)
        if st.last_kind == "prefill":
            last_bs = len(st.last)
            kept = [r for r in st.last if not r.finished() and r is not st.chunked
                    and r.is_chunked <= 0]
            if len(kept) < last_bs:
                st.full = False
            st.running += kept
        result = get_new_batch_prefill()
        if result is not None:
            batch, record = result
            decoding = set(record.get("decode", ()))
            for r in batch:                        # process_batch_result_prefill
                if r.is_chunked > 0:
                    r.is_chunked -= 1
                    continue
                r.output_ids.append(r.out_tokens[len(r.output_ids)])
                if r.finished():
                    release(r)
                elif r.rid not in decoding:        # not batch.decoding_reqs
                    tree.cache_unfinished_req(r)
            st.last, st.last_kind = batch, "prefill"
        elif st.running:
            initial_bs = len(st.running)           # update_running_batch
            st.running = [r for r in st.running if not r.finished()]
            if not st.running:
                st.full = False
                st.last, st.last_kind = None, None
                record = None
            else:
                retracted = []
                if not check_decode_mem(len(st.running)):
                    retracted, st.ratio = retract_decode()
                    st.waiting.extend(retracted)
                else:
                    st.ratio = max(st.ratio - decay, min_ratio)
                if len(st.running) < initial_bs:
                    st.full = False
                prepare_for_decode(st.running, "decode")
                for r in st.running:
                    r.output_ids.append(r.out_tokens[len(r.output_ids)])
                    if r.finished():
                        release(r)
                record = {"kind": "decode", "run": sorted(r.rid for r in st.running),
                          "retracted": [r.rid for r in retracted]}
                st.last, st.last_kind = st.running, "decode"
        else:
            record = None
            st.last, st.last_kind = None, None
        if record is not None:
            trace.append(record)
            batches += 1
        elif not st.running and not st.waiting and st.chunked is None:
            if not pending:
                return trace
            batches = max(batches, arrival[pending[0].rid])
    raise RuntimeError(f"case {case['family']}/{case['seed']} did not drain")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=int, default=1000)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    sgl = _import_sglang()
    out = []
    for case in cases(args.cases):
        try:
            out.append({"family": case["family"], "seed": case["seed"],
                        "trace": run_case(case, sgl)})
        except Exception as exc:       # recorded, so the comparison reports it
            out.append({"family": case["family"], "seed": case["seed"], "error": repr(exc)})
    with open(args.out, "w") as f:
        json.dump(out, f, separators=(",", ":"))
    print(f"{len(out)} cases -> {args.out}")


if __name__ == "__main__":
    main()
