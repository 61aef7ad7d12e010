"""The calibrated cost model: iteration time from measured kernels plus the engine's overhead.

An iteration costs, per GPU (tensor-parallel ranks run in lock step), the GPU kernel time of
:class:`simsched.cost.kernels.KernelTables`:

* ``linear``: every layer's QKV/output projections, MLP and element-wise ops for all tokens;
  measured per-layer times interpolated piecewise-linearly in the token count for a profiled
  (model, TP) on the GPU's measured anchor (A100 or H200), otherwise the roofline with that
  anchor's fitted efficiencies;
* ``attention``: prefill chunks (causal time of the chunk plus chunk x cached tokens) and the
  decodes (a function of how many sequences and how many KV bytes they read);
* ``communication``: two all-reduces of ``tokens x hidden`` activations per layer when TP > 1;
* ``embedding``: token embedding and the LM head (one logit row per sequence);

plus the ``overhead`` the engine adds around them, chosen by ``engine_overhead`` (see
:mod:`simsched.cost.overhead`: ``vllm_v1`` by default, ``measured_2023``, ``eager_2023``,
``overlapped``, ``none``). Which GPUs are measured and which extrapolated: :func:`simsched.cost.hardware.describe`.

Speed: all token-count and sequence-count dependent parts are precomputed into plain Python
lists, so :meth:`CalibratedCostModel.iteration_time` is a handful of list look-ups.
"""

from __future__ import annotations

import copy
import functools

import numpy as np

from simsched.cost import calibration as cal
from simsched.cost import deployment, host_time, overhead
from simsched.cost import engine_profiles, serving, vllm_silicon, vllm_v1
from simsched.cost.base import Batch
from simsched.cost.profiles import PROFILES
from simsched.cost.hardware import (AIC, GPU_SOURCES, REFERENCE_GPU, GPUSpec, ModelSpec,
                                    kernel_source)
from simsched.cost.kernels import MIN_TABLE, KernelTables  # noqa: F401  (MIN_TABLE re-exported)

# The engine profiles of vllm_v1's form -> their terms: vllm_silicon is vllm_v1 with the terms
# fitted on the silicon rows (simsched.cost.vllm_silicon); the other engines' profiles take
# vllm_v1's form (simsched.cost.engine_profiles).
VLLM_FORM = {"vllm_v1": vllm_v1.terms, "vllm_silicon": vllm_silicon.terms,
             **{engine: functools.partial(engine_profiles.terms, engine)
                for engine in engine_profiles.OVERRIDES},
             **{name: functools.partial(engine_profiles.carried_terms, name)
                for name in engine_profiles.CARRIED}}
# Profiles carrying the silicon terms -> the profile they add them to. The terms correct
# simsched's calibrated kernel tables, on which they were fitted; on AIConfigurator's measured
# tables (hardware.kernel_profile="aiconfigurator", and the GPUs with no other kernels) they
# over-correct (the vLLM silicon rows, median abs. TTFT / TPOT error 22 / 14 % -> 44 / 20 %:
# experiments.validate_silicon --kernels aiconfigurator --terms fitted), so there the base
# profile's terms apply.
SILICON_BASE = {"vllm_silicon": "vllm_v1", **engine_profiles.CARRIED}


def terms_profile(engine_overhead: str, gpu: GPUSpec) -> str:
    """The profile whose terms ``engine_overhead`` uses on ``gpu``: itself, or its base profile
    where ``gpu`` reads AIConfigurator's tables (:data:`SILICON_BASE`)."""
    if engine_overhead in SILICON_BASE and gpu.kernels.startswith(AIC):
        return SILICON_BASE[engine_overhead]
    return engine_overhead


def profile_terms(engine_overhead: str, gpu: GPUSpec) -> dict:
    """The terms of engine profile ``engine_overhead`` (one of :data:`VLLM_FORM`) on ``gpu``
    (:func:`terms_profile`)."""
    return VLLM_FORM[terms_profile(engine_overhead, gpu)]()


def _extend(table: list, n: int) -> float:
    """Linear extrapolation past the end of a table using its last 1/8 as the slope."""
    last = len(table) - 1
    back = max(1, last // 8)
    return table[last] + (table[last] - table[last - back]) / back * (n - last)


class CalibratedCostModel:
    """Iteration time of ``spec`` on ``gpu`` at tensor-parallel degree ``tp``.

    Immutable after construction (instances are cached and shared between runs).
    ``coefficients`` defaults to the shipped kernel fits (:mod:`simsched.cost.fits`); it
    may also be a mapping of anchor GPU to fits, or a plain A100 dict as ``fit_all()`` returns;
    ``engine_overhead`` names the overhead choice; ``engine_terms`` overrides the fitted
    ``eager_2023`` terms (a dict as :func:`simsched.cost.serving.engine_terms` gives per measured
    serving system) or ``vllm_v1`` terms (as :func:`simsched.cost.vllm_v1.terms` gives).
    ``output_delay``: seconds from a step's end until the client sees its tokens (``vllm_v1``;
    0 otherwise); the engine adds it to the reported first-token and finish times.
    ``parallel``: a :class:`simsched.config.parallel.ParallelConfig` whose expert-parallel and
    data-parallel settings shape the MoE layers (:mod:`simsched.cost.moe`); the pipeline and
    data-parallel batch split is :class:`simsched.cost.parallel.ParallelCostModel`'s.
    ``adjust``: the terms of a calibrated deployment profile (:mod:`simsched.cost.deployment`:
    kernel-class scales, host time per step and per sequence, output delay); None: as shipped.
    """

    #: The time depends on the batch alone (quiet decode steps may be planned ahead).
    pure_iteration_time = True

    def __init__(self, spec: ModelSpec, gpu: GPUSpec, tp: int = 1, model_name: str | None = None,
                 coefficients: dict | None = None, table_tokens: int | None = None,
                 engine_overhead: str = overhead.DEFAULT_ENGINE_OVERHEAD,
                 engine_terms: dict | None = None, parallel=None,
                 adjust: dict | None = None) -> None:
        overhead.check(engine_overhead)
        k = KernelTables(spec, gpu, tp, model_name, coefficients, table_tokens, parallel)
        if adjust is not None:      # a calibrated deployment profile (simsched.cost.deployment)
            adjust = deployment.check_terms(adjust, "adjust")
            deployment.scale_kernels(k, adjust)
        self.adjust = adjust
        self.spec, self.gpu, self.tp, self.model_name = spec, gpu, tp, model_name
        self.engine_overhead = engine_overhead
        self.kernels = k
        size = k.size
        n = np.arange(size, dtype=float)
        if coefficients is None:
            cpu_coef = PROFILES[REFERENCE_GPU].coefficients()["cpu"]
        else:  # an anchor -> coefficients mapping, or a plain A100 coefficient dict
            cpu_coef = coefficients.get(REFERENCE_GPU, coefficients)["cpu"]
        cpu = cal.predict_cpu_overhead(cpu_coef, tp, n)
        comm, lm_head = k.comm, k.lm_head
        # The general path: t = max(GPU x slowdown + sync, floor) + serial[seqs], where the floor
        # is floor[seqs], or floor_prefill when the batch prefills and that is larger, and the
        # slowdown (a power cap) applies to iterations that prefill.
        self._slowdown = gpu.prefill_slowdown
        self._general = engine_overhead in ("overlapped", "eager_2023", *VLLM_FORM) \
            or self._slowdown != 1.0
        self._sync = self._floor_prefill = 0.0
        self.output_delay = 0.0
        floor = serial = np.zeros_like(n)
        prefill_extra = None
        # Host time per step of an engine that does not pipeline (simsched.cost.host_time).
        self._host = (0.0, 0.0)
        self._sync_twin = None
        linear = k.linear
        if engine_overhead == "measured_2023" and self._general:
            per_seq, serial = lm_head, cpu.copy()  # CPU kept out of the power-capped GPU time
        elif engine_overhead == "measured_2023":
            per_seq = lm_head + cpu
        elif engine_overhead == "none":
            cpu = np.zeros_like(n)
            per_seq = lm_head
        elif engine_overhead == "overlapped":
            per_seq, floor = lm_head, cpu.copy()
            serial = np.full_like(n, overhead.overlapped_gap())
        elif engine_overhead in VLLM_FORM:
            terms = engine_terms if engine_terms is not None else \
                profile_terms(engine_overhead, gpu)
            comm = vllm_silicon.scale_comm(k, vllm_v1.comm_table(k, terms["allreduce_latency"]),
                                           terms)
            # Sampling per sequence and vocabulary entry is GPU time: it goes with the LM head
            # (the breakdown's embedding part; a power cap slows it like the other kernels).
            lm_head = lm_head + terms["sampler_per_logit"] * spec.vocab_size * n
            per_seq = lm_head
            self._sync = terms["kernel_per_layer"] * spec.num_layers   # per step, GPU time
            floor = cpu.copy()                  # CPU work is hidden unless longer than the GPU
            serial = np.full_like(n, terms["step_gap"])
            self.output_delay = terms["output_delay"]
            host = host_time.check(terms)
            self._host = (host["sync_step_time"], host["sync_seq_time"])
            # Prefill and fused-MoE terms (simsched.cost.vllm_silicon; absent: neutral, None).
            prefill_extra = vllm_silicon.prefill_extra(k, terms)
            linear = vllm_silicon.scale_experts(k, terms)
        else:
            terms = engine_terms if engine_terms is not None else \
                serving.engine_terms()[gpu.serving]
            comm = comm * terms["comm_scale"]
            big = serving.large_iteration_bytes(k, n) * terms["large_iteration_time_per_byte"]
            self._sync = k.num_collectives * (tp - 1) * terms["sync_per_collective"]
            self._floor_prefill = spec.num_layers * terms["floor_per_layer_prefill"]
            floor = np.full_like(n, spec.num_layers * terms["floor_per_layer"])
            per_seq = lm_head
            serial = terms["serial_per_seq"] * n
        if adjust is not None:
            # The deployment's host time per step and per sequence (never below zero).
            serial = np.maximum(serial + adjust["step_time"] + adjust["seq_time"] * n, 0.0)
            self.output_delay = adjust["output_delay"]
        floor[0] = serial[0] = 0.0
        self._floor, self._serial = floor.tolist(), serial.tolist()

        self._linear, self._emb = linear.tolist(), k.emb.tolist()
        # Seconds a step that prefills adds, by token count (None: nothing).
        self._prefill_extra = None if prefill_extra is None else prefill_extra.tolist()
        if engine_overhead == "eager_2023":
            comm = comm + big  # the large-message term is collective time too
        if k.moe_comm is not None:
            comm = comm + k.moe_comm  # expert-parallel all-to-alls (simsched.cost.moe)
        if adjust is not None:
            comm = comm * adjust["comm_scale"]
        self._comm = comm.tolist()
        self._lm_head, self._cpu = lm_head.tolist(), cpu.tolist()
        self._per_token = (linear + comm + k.emb).tolist()
        self._per_seq = per_seq.tolist()
        self._pre_t0, self._pre_slope = k.pre_t0.tolist(), k.pre_slope.tolist()
        self._dec_a, self._dec_s = k.dec_a.tolist(), k.dec_s.tolist()
        self._sat_a, self._sat_s = k.sat_a, k.sat_s
        self._size = size
        self._decode_terms: dict = {}   # batch size -> decode_iteration_times' shared terms

    def describe(self) -> str:
        """One line: model, GPU, TP, where the kernel times come from (measured, derived or
        extrapolated) and the engine overhead (with its source for ``eager_2023``)."""
        whole = GPU_SOURCES.get(self.gpu.name, ("", f"assumed: {self.gpu.serving} terms"))[1]
        kern = kernel_source(self.gpu)
        text = (f"{self.model_name or 'custom model'} on {self.gpu.name} x{self.tp}: "
                f"{self.gpu.calibration}; kernels {kern}; engine overhead "
                f"{self.engine_overhead}")
        if self.engine_overhead == "eager_2023":
            text += f" (whole-iteration terms {whole})"
        elif self.engine_overhead == "vllm_v1":
            text += (" (terms fitted on real vLLM 0.15 H100 runs; output delay "
                     f"{self.output_delay * 1e3:.1f} ms)")
        elif self.engine_overhead == "vllm_silicon":
            text += (" (vllm_v1's terms and the prefill, all-reduce and fused-MoE terms fitted on "
                     "AIConfigurator's H100/H200 vLLM rows; output delay "
                     f"{self.output_delay * 1e3:.1f} ms)")
        elif self.engine_overhead in engine_profiles.DESCRIPTIONS:
            text += f" ({engine_profiles.DESCRIPTIONS[self.engine_overhead]})"
        used = terms_profile(self.engine_overhead, self.gpu)
        if used != self.engine_overhead:
            text += (f"; on AIConfigurator's tables the silicon terms are left out "
                     f"({used}'s terms)")
        return text

    def synchronous(self) -> "CalibratedCostModel":
        """This model for an engine that does not pipeline its steps (async scheduling or the
        overlap scheduler off): every step of ``s`` sequences also takes the profile's
        ``sync_step_time + sync_seq_time x s`` (:mod:`simsched.cost.host_time`), as serial host
        time after the step's GPU time. The model itself where both are 0 (every shipped
        profile), so the same floats as before; made once and kept."""
        a, b = self._host
        if a == 0.0 and b == 0.0:
            return self
        if self._sync_twin is None:
            twin = copy.copy(self)
            serial = np.asarray(self._serial) + a + b * np.arange(self._size, dtype=float)
            serial[0] = 0.0
            twin._serial = serial.tolist()
            twin._decode_terms = {}
            twin._host, twin._sync_twin = (0.0, 0.0), None   # already synchronous
            self._sync_twin = twin
        return self._sync_twin

    def __repr__(self) -> str:
        return f"CalibratedCostModel({self.model_name or self.spec}, {self.gpu.name}, tp={self.tp})"

    # ------------------------------------------------------------------ fast path

    def iteration_time(self, batch: Batch) -> float:
        """Seconds the iteration takes (sum of :meth:`breakdown`, without building a dict)."""
        if self._general:
            return self._whole_iteration(batch)
        return self._gpu_time(batch)

    def _gpu_time(self, batch: Batch) -> float:
        size = self._size
        n_dec = batch.num_decode_seqs
        new = batch.prefill_new_tokens
        t = 0.0
        if new:
            tokens = n_dec + sum(new)
            seqs = n_dec + len(new)
            t0, slope = self._pre_t0, self._pre_slope
            for c, k in zip(new, batch.prefill_cached_tokens):
                if c < size:
                    t += t0[c] + c * k * slope[c]
                else:
                    t += t0[-1] * (c / (size - 1)) ** 2 + c * k * slope[-1]
        else:
            tokens = seqs = n_dec
        if tokens < size:
            t += self._per_token[tokens] + self._per_seq[seqs]
        else:  # a huge iteration; its sequences may still be within the table
            t += _extend(self._per_token, tokens) + (
                self._per_seq[seqs] if seqs < size else _extend(self._per_seq, seqs))
        if n_dec:
            ctx = batch.decode_context_sum
            if n_dec < size:
                d = self._dec_a[n_dec] + self._dec_s[n_dec] * ctx
            else:
                d = _extend(self._dec_a, n_dec) + self._dec_s[-1] * ctx
            floor = self._sat_a + self._sat_s * ctx
            t += d if d > floor else floor
        return t

    def decode_iteration_times(self, num_seqs: int, first_context_sum: int,
                               num_steps: int) -> list[float]:
        """:meth:`iteration_time` of ``num_steps`` decode-only batches of ``num_seqs`` sequences,
        the first with ``first_context_sum`` context tokens, each next with ``num_seqs`` more:
        the same floats (the same operations in the same order as :meth:`_gpu_time` and
        :meth:`_whole_iteration`), with the table reads the batches share done once per batch
        size (:meth:`_decode_terms_of`). Quiet decode steps are timed with it
        (:mod:`simsched.engine.scheduler.quiet`)."""
        n = num_seqs
        terms = self._decode_terms.get(n)
        if terms is None:
            terms = self._decode_terms_of(n)
        shared, dec_a, dec_s, sat_a, sat_s, sync, serial, floor_all = terms
        first = first_context_sum
        if n:
            contexts = range(first, first + n * num_steps, n)
            last = first + n * (num_steps - 1)
        else:
            contexts = [first] * num_steps
            last = first
        # Where the decode term is above its floor by a clear margin at both ends of the range
        # (the difference is linear in the context, so it is above in between; each term's
        # rounding is ~1e-18 s), and the first step is above the iteration floor (the times
        # grow with the context), no step takes a floor: the same sums, without the tests.
        if dec_a + dec_s * first - (sat_a + sat_s * first) > 1e-9 \
                and dec_a + dec_s * last - (sat_a + sat_s * last) > 1e-9 and dec_s >= 0:
            if sync is None:
                return [shared + (dec_a + dec_s * c) for c in contexts]
            if shared + (dec_a + dec_s * first) + sync > floor_all:
                return [shared + (dec_a + dec_s * c) + sync + serial for c in contexts]
        times = []
        if sync is None:
            for ctx in contexts:
                d = dec_a + dec_s * ctx
                floor = sat_a + sat_s * ctx
                times.append(shared + (d if d > floor else floor))
            return times
        for ctx in contexts:
            d = dec_a + dec_s * ctx
            floor = sat_a + sat_s * ctx
            t = shared + (d if d > floor else floor) + sync
            times.append((t if t > floor_all else floor_all) + serial)
        return times

    def _decode_terms_of(self, n: int) -> tuple:
        """What every decode-only batch of ``n`` sequences shares, read from the tables once
        and kept: ``(per-token and per-sequence time, decode intercept and slope, the decode
        floor's intercept and slope, sync, serial time, iteration floor)``, the last three None
        without the general path's terms."""
        at = self._at
        shared = 0.0 + (at(self._per_token, n) + at(self._per_seq, n))
        # Past the table the slope is its last value (as _gpu_time has it), not extrapolated.
        dec_a = at(self._dec_a, n)
        dec_s = self._dec_s[n] if n < self._size else self._dec_s[-1]
        sync = serial = floor_all = None
        if self._general:
            sync, serial, floor_all = self._sync, at(self._serial, n), at(self._floor, n)
        terms = (shared, dec_a, dec_s, self._sat_a, self._sat_s, sync, serial, floor_all)
        self._decode_terms[n] = terms
        return terms

    def _whole_iteration(self, batch: Batch) -> float:
        new = batch.prefill_new_tokens
        seqs = len(new) + batch.num_decode_seqs         # batch.num_seqs, without the call
        t = self._gpu_time(batch)
        # self._at(table, seqs), inlined: once per iteration outside quiet runs
        if seqs < self._size:
            floor, serial = self._floor[seqs], self._serial[seqs]
        else:
            floor, serial = _extend(self._floor, seqs), _extend(self._serial, seqs)
        if new:
            t *= self._slowdown
            if self._prefill_extra is not None:
                t += self._at(self._prefill_extra, sum(new) + batch.num_decode_seqs)
            if self._floor_prefill > floor:
                floor = self._floor_prefill
        t += self._sync
        return (t if t > floor else floor) + serial

    # ------------------------------------------------------------------ slow path

    def _at(self, table: list, i: int) -> float:
        return table[i] if i < self._size else _extend(table, i)

    def breakdown(self, batch: Batch) -> dict:
        """Seconds per part: linear, attention, communication, embedding, overhead.

        The values sum to :meth:`iteration_time` (up to float rounding).
        """
        tokens, seqs = batch.num_tokens, batch.num_seqs
        pre = 0.0
        for c, k in zip(batch.prefill_new_tokens, batch.prefill_cached_tokens):
            if c < self._size:
                pre += self._pre_t0[c] + c * k * self._pre_slope[c]
            else:
                pre += self._pre_t0[-1] * (c / (self._size - 1)) ** 2 + c * k * self._pre_slope[-1]
        dec = 0.0
        if batch.num_decode_seqs:
            n, ctx = batch.num_decode_seqs, batch.decode_context_sum
            slope = self._dec_s[n] if n < self._size else self._dec_s[-1]
            dec = max(self._at(self._dec_a, n) + slope * ctx, self._sat_a + self._sat_s * ctx)
        extra = self._at(self._prefill_extra, tokens) \
            if self._prefill_extra is not None and batch.prefill_new_tokens else 0.0
        parts = {
            "linear": self._at(self._linear, tokens) + extra,
            "attention": pre + dec,
            "communication": self._at(self._comm, tokens),
            "embedding": self._at(self._emb, tokens) + self._at(self._lm_head, seqs),
            "overhead": self._at(self._cpu, seqs),
        }
        if self._general:
            # Whatever the engine adds beyond the kernels: the sync, the part of the floor the
            # GPU does not cover, and the serial CPU time.
            gpu = sum(parts.values()) - parts["overhead"]
            parts["overhead"] = self.iteration_time(batch) - gpu
        return parts
