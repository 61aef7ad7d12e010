"""Pipeline and data-parallel-attention replicas: iteration time and KV capacity.

A replica with ``hardware.parallel`` set (:class:`simsched.config.parallel.ParallelConfig`) is
still one engine that computes one :class:`~simsched.cost.base.Batch` per iteration; this module
says what that iteration costs on its tp x pp x dp GPUs.

* **Data-parallel attention** (dp ranks): the batch's sequences are dealt round-robin to the
  ranks; every rank is assumed to carry a batch like the busiest one's (rank 0), which is timed
  by a stage model whose MoE layers see ``dp`` times its tokens (:mod:`simsched.cost.moe`).
* **Pipeline parallelism** (pp stages of ``layers / pp`` layers, ``m = num_micro_batches`` in
  flight): the batch is split round-robin into ``min(m, sequences)`` micro-batches; every
  sequence gets its token once its micro-batch has passed all pp stages, so the iteration takes
  ``pp`` stage times of one micro-batch plus ``pp - 1`` stage-to-stage activation transfers
  (``tokens x hidden`` bytes over half the NVLink bandwidth, or the network across nodes). With
  one micro-batch in flight that is the sum of the stage times; with ``m = pp`` the stages are
  busy with the other micro-batches meanwhile (steady state), which is where the throughput
  comes from; with fewer ready micro-batches than stages, stages idle (the bubble).

The KV capacity of such a replica: :func:`simsched.cost.hardware.kv_capacity_blocks`.

What is approximated (the replica's GPU loop is not overlapped across iterations): an iteration
is the pipeline's steady state, not a schedule of individual micro-batches; the engine's step
overhead (``vllm_v1``: step gap, sampler, CPU floor) is paid once per iteration, on the last
stage; every stage's kernel tables carry the LM head (``layers / pp`` layers each, but the
embedding and head on every stage: an over-estimate of a few percent for big vocabularies);
data-parallel ranks are balanced.
"""

from __future__ import annotations

import copy
import dataclasses
import math

from simsched.cost.base import Batch
from simsched.cost.calibrated import CalibratedCostModel
from simsched.cost.hardware import GPUSpec, ModelSpec


def split_batch(batch: Batch, parts: int) -> Batch:
    """The largest of ``parts`` round-robin shares of ``batch``: prefill chunks 0, parts, 2 parts,
    ...; ``ceil(decodes / parts)`` decodes with their proportional share of the context."""
    if parts <= 1:
        return batch
    new = batch.prefill_new_tokens[::parts]
    cached = batch.prefill_cached_tokens[::parts]
    n = batch.num_decode_seqs
    share = -(-n // parts)
    ctx = batch.decode_context_sum * share // n if n else 0
    return Batch(new, cached, share, ctx)


def stage_spec(spec: ModelSpec, pp: int) -> ModelSpec:
    """One pipeline stage's shape: ``ceil(layers / pp)`` layers (the slowest stage)."""
    return spec if pp == 1 else dataclasses.replace(spec, num_layers=math.ceil(spec.num_layers
                                                                                / pp))


def transfer_time(tokens: int, spec: ModelSpec, gpu: GPUSpec, cross_node: bool,
                  inter_node_bandwidth: float) -> float:
    """Seconds to pass ``tokens`` activations (hidden x activation bytes) to the next stage."""
    link = inter_node_bandwidth if cross_node else gpu.interconnect_bandwidth / 2
    return tokens * spec.hidden_size * spec.bytes_per_param / link


class ParallelCostModel:
    """Iteration time of a replica laid out by a ``ParallelConfig`` (see the module docstring).

    ``last``: the last stage's cost model (with the engine overhead); ``inner``: the other
    stages' (kernels only; ``None`` at pp 1). Exposes ``engine_overhead`` and ``output_delay``
    as the calibrated model does, so the engine's async scheduling and output delay follow it.
    """

    def __init__(self, spec: ModelSpec, gpu: GPUSpec, tp: int, parallel, model_name=None,
                 engine_overhead: str = "vllm_v1", engine_terms: dict | None = None,
                 adjust: dict | None = None) -> None:
        self.parallel, self.spec, self.gpu, self.tp = parallel, spec, gpu, tp
        self.pp, self.dp = parallel.pipeline_parallel_size, parallel.data_parallel_size
        self.micro_batches = parallel.num_micro_batches
        stage = stage_spec(spec, self.pp)
        self.last = CalibratedCostModel(stage, gpu, tp, model_name, engine_overhead=engine_overhead,
                                        engine_terms=engine_terms, parallel=parallel,
                                        adjust=adjust)
        # Inner stages: kernels only, so only the kernel-class scales apply to them.
        inner_adjust = None if adjust is None else {**adjust, "step_time": 0.0, "seq_time": 0.0}
        self.inner = None if self.pp == 1 else CalibratedCostModel(
            stage, gpu, tp, model_name, engine_overhead="none", parallel=parallel,
            adjust=inner_adjust)
        self.engine_overhead = engine_overhead
        self.output_delay = self.last.output_delay
        self._cross = tp * self.pp > parallel.gpus_per_node
        self._sync = None       # (per step, per sequence) host time: synchronous()

    def __repr__(self) -> str:
        p = self.parallel
        return (f"ParallelCostModel(tp={self.tp}, pp={self.pp}, dp={self.dp}, "
                f"ep={p.enable_expert_parallel}, micro_batches={self.micro_batches})")

    def stage_times(self, batch: Batch) -> list[float]:
        """Seconds each stage takes for ``batch`` (one micro-batch, one data-parallel rank)."""
        if self.pp == 1:
            return [self.last.iteration_time(batch)]
        inner = self.inner.iteration_time(batch)
        return [inner] * (self.pp - 1) + [self.last.iteration_time(batch)]

    def synchronous(self) -> "ParallelCostModel":
        """This model for an engine that does not pipeline its steps: each step also takes the
        profile's host time (:mod:`simsched.cost.host_time`) for its data-parallel rank's
        sequences, once per step (not per micro-batch); itself where that is 0."""
        a, b = self.last._host
        if self._sync is not None or (a == 0.0 and b == 0.0):
            return self
        twin = copy.copy(self)
        twin._sync = (a, b)
        return twin

    def _host_time(self, rank: Batch) -> float:
        a, b = self._sync
        return a + b * rank.num_seqs

    def transfer(self, tokens: int) -> float:
        """Seconds of one stage-to-stage activation transfer of ``tokens`` tokens."""
        return transfer_time(tokens, self.spec, self.gpu, self._cross,
                             self.parallel.inter_node_bandwidth)

    def iteration_time(self, batch: Batch) -> float:
        """Seconds until every sequence of ``batch`` has its next token (module docstring)."""
        rank = split_batch(batch, self.dp)
        if self.pp == 1:
            t = self.last.iteration_time(rank)
        else:
            micro = split_batch(rank, min(self.micro_batches, max(rank.num_seqs, 1)))
            t = sum(self.stage_times(micro)) + (self.pp - 1) * self.transfer(micro.num_tokens)
        return t if self._sync is None else t + self._host_time(rank)

    def breakdown(self, batch: Batch) -> dict:
        """The last stage's breakdown of one micro-batch, with the other stages and transfers
        as ``pipeline``; the values sum to :meth:`iteration_time`."""
        rank = split_batch(batch, self.dp)
        if self.pp == 1:
            parts = self.last.breakdown(rank)
            if self._sync is not None:
                parts["overhead"] += self._host_time(rank)
            return parts
        micro = split_batch(rank, min(self.micro_batches, max(rank.num_seqs, 1)))
        parts = self.last.breakdown(micro)
        parts["pipeline"] = self.iteration_time(batch) - sum(parts.values())
        return parts

