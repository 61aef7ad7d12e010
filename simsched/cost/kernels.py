"""GPU kernel time of an iteration, as tables by token and sequence count, from the measured fits.

Every GPU takes its kernel fits from a *measured anchor*, the calibration profile its
``GPUSpec.kernels`` names (:mod:`simsched.cost.profiles`: ``a100-80gb`` for the A100s and the L40S,
``h200`` for the H200 and H100s); the profile builds the tables from its shipped coefficients.

The rule for a GPU that is not its own anchor: compute-bound terms (GEMM roofline, prefill
attention FLOPs) scale with the datasheet peak FLOP/s, memory-bound ones (GEMM weight reads,
element-wise ops, decode attention's KV reads) with HBM bandwidth, fixed launch/latency terms do
not scale; all-reduces always come from the A100 NCCL profile scaled by interconnect bandwidth.

:class:`KernelTables` holds plain numpy arrays; :class:`simsched.cost.calibrated.CalibratedCostModel`
adds the engine's whole-iteration terms and turns them into Python lists for speed.
"""

from __future__ import annotations

import numpy as np

from simsched.cost import calibration as cal
from simsched.cost import moe, shapes
from simsched.cost.hardware import GPUS, REFERENCE_GPU, GPUSpec, ModelSpec
from simsched.cost.profiles import PROFILES, get_profile

MIN_TABLE = 8192


class KernelTables:
    """Per-iteration GPU kernel seconds of ``spec`` on ``gpu`` at TP ``tp``, by token count.

    Attributes (numpy arrays indexed by token or sequence count, all layers included): ``linear``,
    ``comm`` (two all-reduces per layer), ``emb`` (token embedding), ``lm_head`` (one logit row per
    sequence), ``pre_t0`` / ``pre_slope`` (prefill attention: causal time of a chunk, and cost per
    chunk token x cached token), ``dec_a`` / ``dec_s`` (decode attention by sequence count: fixed
    part and cost per cached token read) with the floor ``sat_a + sat_s x cached tokens``.
    ``coefficients`` maps anchor names to fitted coefficients (default: the shipped fits,
    :mod:`simsched.cost.fits`; an A100 coefficient dict as
    :func:`simsched.cost.calibration.fit_all` returns also works). ``parallel`` (a
    :class:`simsched.config.parallel.ParallelConfig`) and a non-plain model (MoE, MLA,
    quantised) route the linear part through :mod:`simsched.cost.moe`; ``moe_comm`` is then its
    expert-parallel all-to-all seconds by token count (None for a plain model).
    """

    def __init__(self, spec: ModelSpec, gpu: GPUSpec, tp: int = 1, model_name: str | None = None,
                 coefficients: dict | None = None, table_tokens: int | None = None,
                 parallel=None) -> None:
        if not isinstance(spec, ModelSpec):
            raise ValueError(f"spec must be a ModelSpec, got {type(spec).__name__}")
        if not isinstance(gpu, GPUSpec):
            raise ValueError(f"gpu must be a GPUSpec, got {type(gpu).__name__}")
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise ValueError(f"tp must be a positive integer, got {tp!r}")
        profile = get_profile(gpu.kernels)
        if coefficients is None or "linear" in coefficients:
            # Only the profiles this GPU needs (its own, and the A100 for the all-reduces) are
            # read; a plain A100 coefficient dict (as fit_all() returns) stands for the A100's.
            needed = {REFERENCE_GPU: coefficients or PROFILES[REFERENCE_GPU].coefficients()}
            if gpu.kernels != REFERENCE_GPU:
                needed[gpu.kernels] = profile.coefficients()
            coefficients = needed
        self.spec, self.gpu, self.tp, self.model_name = spec, gpu, tp, model_name
        self.anchor = gpu.kernels
        self.size = max(MIN_TABLE, spec.max_context, table_tokens or 0) + 1
        n = np.arange(self.size, dtype=float)
        # Seconds of one all-reduce by token count, for a profile that measured them (else the
        # A100 NCCL fit scaled by link bandwidth, below).
        self.all_reduce_per_call = None
        # Whether the profile timed this (non-plain) model's linear part and KV dtype itself.
        self.linear_complete = False
        profile.build(self, coefficients[gpu.kernels], n)
        # ---- tensor-parallel all-reduces: after attention and after the MLP in every layer
        if self.all_reduce_per_call is not None:   # the profile measured them on this GPU
            comm = 2 * spec.num_layers * self.all_reduce_per_call
        else:
            ref = GPUS[REFERENCE_GPU]
            link_ratio = ref.interconnect_bandwidth / gpu.interconnect_bandwidth
            msg = n * spec.hidden_size * spec.bytes_per_param
            comm = 2 * spec.num_layers * cal.predict_all_reduce(
                coefficients[REFERENCE_GPU]["all_reduce"], tp, msg, link_ratio)
        comm = np.maximum.accumulate(comm)
        comm[0] = 0.0
        self.comm = comm
        self.num_collectives = 2 * spec.num_layers if tp > 1 else 0
        self.moe_comm = None
        if (parallel is not None or not spec.is_plain) and not self.linear_complete:
            moe.apply(self, coefficients[gpu.kernels], n, parallel)  # MoE, MLA, quantised
        if spec.sliding_window:
            self._sliding_window(n)

    def _sliding_window(self, n: np.ndarray) -> None:
        """Attention of a model whose ``num_sliding_window_layers`` attend to the last
        ``sliding_window`` tokens only (gpt-oss): those layers' prefill reads no cached prefix
        beyond the window, and a decode reads at most the window per sequence
        (charged as the whole window: contexts here are longer than gpt-oss's 128). A window
        layer's chunk of c > w tokens does ``2 w / c`` of the causal pairs of a full one, at the
        full chunk's FLOP rate (one kernel launch, not c / w), and never less than a w-token
        chunk."""
        spec = self.spec
        full = shapes.full_attention_layers(spec) / spec.num_layers
        window = float(spec.sliding_window)
        w = min(int(window), self.size - 1)
        t0 = self.pre_t0
        pairs = np.minimum(1.0, 2.0 * window / np.maximum(n, 1.0))
        windowed = np.where(n <= window, t0, np.maximum(t0[w], t0 * pairs))
        self.pre_t0 = np.maximum.accumulate(full * t0 + (1.0 - full) * windowed)
        self.pre_slope = self.pre_slope * full
        self.dec_a = self.dec_a + (1.0 - full) * self.dec_s * n * window
        self.dec_s = self.dec_s * full
        self.sat_s = self.sat_s * full

    def finish_linear(self, per_layer: np.ndarray, emb_t: np.ndarray) -> None:
        """Set ``linear`` (all layers) and ``emb`` from per-layer linear and embedding times."""
        per_layer[0] = 0.0
        emb_t[0] = 0.0
        # Measured kernels jitter by a few percent between neighbouring token counts; a running
        # maximum keeps "more tokens never cost less" without moving any point by more than that.
        per_layer = np.maximum.accumulate(per_layer)
        self.emb = np.maximum.accumulate(emb_t)
        self.linear = per_layer * self.spec.num_layers
