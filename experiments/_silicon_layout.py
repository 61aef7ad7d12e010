"""How a silicon row's deployment becomes simsched replicas: one serving pool, or disaggregated.

``experiments.validate_silicon`` reads a row's layout here (it re-exports :func:`layout`).

**One pool** (``mode = agg``, :func:`layout`): ``tp_size`` GPUs of tensor parallelism; expert
parallelism where ``moe_ep_size`` > 1; attention data parallelism with expert parallelism (DEP)
where ``attention_dp_size`` > 1; MoE ranks beyond the attention TP (``moe_tp_size x moe_ep_size
> tp_size``) as data-parallel attention ranks.

**Disaggregated** (``mode = disagg``, :func:`disagg_config`): ``prefill_num_workers`` prefill
replicas and ``decode_num_workers`` decode replicas, each worker laid out by the rule above from
its role's columns (``prefill_tp_size``, ``decode_attention_dp_size``, ...) and configured as an
aggregated row of that layout would be (the engine's recipe, memory flag and settings), then put
on one clock as simsched's prefill and decode roles (``cluster.roles``; docs/disaggregation.md):

* the client's concurrency: ``silicon_concurrency`` where the source gives it, else
  ``decode_batch_size x decode_attention_dp_size x decode_num_workers`` (AIConfigurator's own
  rule: the decode workers' batch, summed);
* routing: round robin over each role's workers (Dynamo's frontend default), every prompt
  prefilled on a prefill worker (``disagg_min_prompt_tokens = 0``);
* the KV link: the GPU's NVLink (one direction, per GPU) where all the deployment's GPUs fit one
  NVLink domain, else one 400 Gb/s NIC per GPU (``ib400``, as DGX/HGX H100 and H200 nodes have),
  for every transfer: which workers share a node is not recorded.

A row whose worker counts are not recorded (the InferenceX database's multi-node DeepSeek rows)
or whose worker spans more than one node is refused with a reason naming it.
"""

from __future__ import annotations

import dataclasses

import pandas as pd

from simsched.config import SimConfig
from simsched.config.cluster import REPLICA_SECTIONS
from simsched.config.parallel import ParallelConfig
from simsched.cost.hardware import GPUS, MODELS

ROLES = ("prefill", "decode")
_PARALLEL = ("tp_size", "pp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size",
             "batch_size")
# One direction, per GPU (GB/s): NVLink 3 (A100), 4 (H100/H200), 5 (Blackwell).
NVLINK_GBPS = {"NVLink 3": 300.0, "NVLink 4": 450.0, "NVLink 5": 900.0}
CROSS_NODE_LINK = "ib400"
ROUTER = "round_robin"
NODE_GPUS = 8


def size(x) -> int:
    """A layout column as a count (NaN and 0, 'not used', count as 1)."""
    return int(x) if x == x and x > 0 else 1


def layout(row) -> tuple[str, int, ParallelConfig | None]:
    """(label, tensor-parallel size, parallel layout) of one worker (the module docstring)."""
    tp, adp = int(row.tp_size), size(row.attention_dp_size)
    mtp, mep, pp = size(row.moe_tp_size), size(row.moe_ep_size), size(row.pp_size)
    moe = isinstance(row.model, str) and MODELS[row.model].num_experts > 0
    if adp > 1:
        # DEP: each GPU an attention rank. InferenceX writes DEP 8 as tp 8 with 8 attention
        # ranks, AIConfigurator's own runs as tp 1 with 8: both are 8 GPUs.
        tp_per_rank = max(1, tp // adp)
        return f"dep{tp_per_rank * adp}", tp_per_rank, ParallelConfig(
            data_parallel_size=adp, enable_expert_parallel=True, pipeline_parallel_size=pp)
    if moe and mtp * mep > tp:                   # MoE ranks beyond the attention TP
        dp = mtp * mep // tp
        return f"tp{tp}-dp{dp}", tp, ParallelConfig(data_parallel_size=dp,
                                                    enable_expert_parallel=mep > 1,
                                                    pipeline_parallel_size=pp)
    if moe and mep > 1:
        return f"tp{tp}-ep{mep}", tp, ParallelConfig(enable_expert_parallel=True,
                                                     pipeline_parallel_size=pp)
    if pp > 1:
        return f"tp{tp}-pp{pp}", tp, ParallelConfig(pipeline_parallel_size=pp)
    return f"tp{tp}", tp, None


def is_disagg(row) -> bool:
    """Whether ``row`` is a disaggregated deployment."""
    return getattr(row, "mode", "agg") == "disagg"


def concurrency(raw: pd.DataFrame) -> pd.Series:
    """The client's concurrency of disaggregated rows without ``silicon_concurrency``: the
    decode workers' batch, summed (NaN for the other rows, and without the decode columns)."""
    if not {"decode_batch_size", "decode_attention_dp_size", "decode_num_workers"} <= set(raw):
        return pd.Series(float("nan"), index=raw.index)
    out = (raw.decode_batch_size * raw.decode_attention_dp_size.where(
        raw.decode_attention_dp_size > 0, 1.0).fillna(1.0) * raw.decode_num_workers)
    return out.where(raw["mode"] == "disagg")


def role_row(row, role: str):
    """``row`` as one aggregated worker of ``role``: that role's layout columns in place of the
    row's own, ``mode = agg`` (a namedtuple from ``itertuples``, as validate_silicon reads)."""
    changes = {name: getattr(row, f"{role}_{name}") for name in _PARALLEL}
    return row._replace(mode="agg", **changes)


def num_workers(row, role: str) -> int:
    """Workers of ``role`` (0 when not recorded)."""
    n = getattr(row, f"{role}_num_workers", float("nan"))
    return int(n) if n == n and n > 0 else 0


def worker_gpus(row) -> int:
    """GPUs one worker of an aggregated (or role) row spans, as :func:`layout` lays it out."""
    _, tp, par = layout(row)
    if par is None:
        return tp
    return tp * par.data_parallel_size * par.pipeline_parallel_size


def domain_gpus(gpu: str) -> int:
    """The most GPUs one deployment may span on ``gpu``: its NVLink domain (72 in a GB200 /
    GB300 NVL72 rack), at least one 8-GPU node (PCIe GPUs too); serving across it is not
    modelled."""
    return max(GPUS[gpu].nvlink_domain, NODE_GPUS)


def deployment_gpus(row) -> int:
    """GPUs an aggregated row's deployment spans: its worker as :func:`layout` lays it out, or
    the MoE ranks if the row names more."""
    return max(worker_gpus(row), size(row.moe_tp_size) * size(row.moe_ep_size))


def why_not(row, refuse=None) -> str:
    """Why the disaggregated ``row`` cannot be simulated ('' when it can); ``refuse``: the
    engine's own reasons, asked of each role's worker."""
    for role in ROLES:
        if not num_workers(row, role) or pd.isna(getattr(row, f"{role}_tp_size", None)):
            return (f"disaggregated deployment: {role} worker count or layout not recorded "
                    "in the silicon row")
    if pd.isna(row.concurrency):
        return "disaggregated deployment: concurrency not recorded"
    for role in ROLES:
        worker = role_row(row, role)
        node, gpus = domain_gpus(row.gpu), worker_gpus(worker)
        if gpus > node:
            return (f"disaggregated deployment: a {role} worker spans {gpus} "
                    f"GPUs, more than one {node}-GPU NVLink node (multi-node serving is not "
                    "modelled)")
        reason = refuse(worker) if refuse is not None else ""
        if reason:
            return f"{role} worker: {reason}"
    return ""


def label(row) -> str:
    """``p{N}x{layout}-d{M}x{layout}``: the workers of each role and their layout."""
    return "-".join(f"{role[0]}{num_workers(row, role)}x{layout(role_row(row, role))[0]}"
                    for role in ROLES)


def total_gpus(row) -> int:
    """GPUs of the whole deployment."""
    return sum(num_workers(row, r) * worker_gpus(role_row(row, r)) for r in ROLES)


def link_of(row) -> dict:
    """The KV link settings of the deployment (module docstring)."""
    gpu = GPUS[row.gpu]
    if total_gpus(row) <= gpu.nvlink_domain and gpu.nvlink in NVLINK_GBPS:
        return {"link": "nvlink", "link_bandwidth_gbps": NVLINK_GBPS[gpu.nvlink]}
    return {"link": CROSS_NODE_LINK}


def _differences(config: SimConfig, base: SimConfig) -> dict:
    """``config``'s scheduler, cache and hardware fields that differ from ``base``'s, dotted."""
    out = {}
    for section in REPLICA_SECTIONS:
        mine, theirs = getattr(config, section), getattr(base, section)
        for field in dataclasses.fields(mine):
            value = getattr(mine, field.name)
            if value != getattr(theirs, field.name):
                out[f"{section}.{field.name}"] = value
    return out


def disagg_config(row, worker_config) -> tuple[SimConfig, str]:
    """The disaggregated ``row`` as one simsched cluster; ``worker_config(role_row)`` gives one
    worker's config and client as an aggregated row of that layout (validate_silicon's
    ``config_of`` with the engine and kernels bound). The decode workers' config is the base,
    the prefill workers' differences are their replicas' overrides."""
    (prefill, kind), (decode, _) = (worker_config(role_row(row, r)) for r in ROLES)
    num_p, num_d = num_workers(row, "prefill"), num_workers(row, "decode")
    overrides = _differences(prefill, decode)
    cfg = decode.replace(num_replicas=num_p + num_d, num_prefill_replicas=num_p,
                         num_decode_replicas=num_d,
                         replicas=({**overrides, "count": num_p},) if overrides else (),
                         router=ROUTER, decode_router=ROUTER, disagg_min_prompt_tokens=0,
                         **link_of(row))
    return cfg, kind
