"""AIConfigurator's own silicon runs as its generator deploys and benchmarks them.

The rows of ``hopper.csv`` whose source is ``aic-auto-gap-analysis`` (``row.aic_run``) are
AIConfigurator's own runs; they publish no client or launch flags. What is published is the
generator that deploys and benchmarks AIConfigurator's configurations (ai-dynamo/aiconfigurator at
095f58a, ``src/aiconfigurator/generator/``), and :func:`changes` applies it to a row:

* the server, for an aggregated worker of batch size ``bs`` (the row's concurrency), from the
  benchmark rule plugin (``rule_plugin/benchmark/{vllm,sglang,trtllm}.rule``; the default
  plugin of the generator's first version, 2025-12-04, set the same limits):
  vLLM ``max_num_seqs`` = ``bs``, ``max_num_batched_tokens`` = ``bs + ISL + 1500``,
  ``max_model_len`` = ``ISL + OSL + 1500``; SGLang ``--max-running-requests`` = ``bs``,
  ``--max-prefill-tokens`` = ``ISL + 1500``, ``--enable-mixed-chunk`` (see below); TensorRT-LLM
  ``max_batch_size`` = ``bs``, ``max_num_tokens`` = ``bs + ISL + 1500`` rounded up to the 32-token
  block. Everything else stays the engine's default, as the generator leaves it;
* the client, from the generated benchmark (``backend_templates/benchmark/bench_run.sh.j2``,
  defaults in ``config/deployment_config.yaml``): aiperf at concurrency ``C``, ``--isl`` /
  ``--osl`` with standard deviation 0 (every request exactly ISL in and OSL out, ``ignore_eos``),
  ``20 x C`` measured requests after ``2 x C`` warm-ups, each with a prompt of its own.

Reused prompts: the generated command does not pass ``--num-dataset-entries``, and aiperf's
synthetic dataset then holds 100 prompts that every request draws from (``shuffle``: a new
permutation each pass; warm-ups from the same sequence), so from the 101st request on a prompt
repeats and a server with prefix caching (on by default in all three engines) serves it from
its cache. ``reused=True`` sends them so (``ClientConfig.preset('aiperf')``'s prompt order).
The rows say the runs did not: with reuse the SGLang and TensorRT-LLM rows' TPOT and TTFT
errors grow several-fold, and vLLM's Qwen3-32B runs come out far too fast
(``python -m experiments.aic_runs``), so the default is a prompt per request.

SGLang's ``--enable-mixed-chunk``: the generator has set it for aggregated workers since
2026-01-19 (#257, #258, "add sglang enable-mix-chunk for generator"); before that it did not.
Its SGLang 0.5.6.post2 template was added on 2026-01-23, so those runs had it; the 0.5.1.post1
template dates from 2025-12-04, and those runs are taken without it: :data:`MIXED_CHUNK_SINCE`.
That choice is read from the rows (AIConfigurator's Qwen3-32B runs on SGLang 0.5.1.post1 match
the unmixed deployment, not the mixed one), so ``experiments.aic_runs`` reports both.
"""

from __future__ import annotations

from simsched.config.client import AIPERF_PROMPTS

RECIPES = ("generator", "inferencex")
# SGLang versions from which the generator's template sets --enable-mixed-chunk (0.5.6.post2:
# added 2026-01-23, after the flag); earlier versions' runs are taken without it.
MIXED_CHUNK_SINCE = (0, 5, 6)
CLIENT = "aiperf (AIConfigurator's generated benchmark, assumed)"
SOURCE = "AIConfigurator's generator, rule_plugin/benchmark (assumed)"


def version_tuple(text) -> tuple:
    """The first three numeric parts of a version string (``0.5.6.post2`` -> (0, 5, 6))."""
    parts = []
    for piece in str(text).split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def mixed_chunk(row) -> bool:
    """Whether the generator deployed ``row``'s SGLang worker with ``--enable-mixed-chunk``."""
    return version_tuple(row.backend_version) >= MIXED_CHUNK_SINCE


def changes(cfg, row, engine: str, max_context: int, mixed: bool | None = None,
            reused: bool = False) -> dict:
    """Config changes (``SimConfig.replace`` keys) that make ``cfg`` — the row as simulated with
    InferenceX's client and the engine's defaults — the generator's deployment and benchmark of
    ``row``. ``max_context``: the model's longest context; ``mixed``: SGLang's
    ``--enable-mixed-chunk`` (None: :func:`mixed_chunk`). Limits are per attention-DP rank, as
    the generator sets them, and simsched's totals over the ranks. ``reused``: aiperf's 100
    dataset prompts reused (module docstring)."""
    c, isl, osl = int(row.concurrency), int(row.isl), int(row.osl)
    par = cfg.hardware.parallel
    dp = par.data_parallel_size if par is not None else 1
    bs = max(1, c // dp)
    out = {"client.random_range_ratio": 1.0, "client.num_prompts": 20 * c,
           "client.num_warmups": 2 * c, "scheduler.max_num_seqs": bs * dp}
    if reused:
        out.update({f"client.{name}": value for name, value in AIPERF_PROMPTS.items()})
    if engine == "vllm":
        out["scheduler.max_num_batched_tokens"] = (bs + isl + 1500) * dp
        out["max_model_len"] = min(isl + osl + 1500, max_context)
    elif engine == "sglang":
        opts = dict(cfg.scheduler.engine_options)
        opts["max_prefill_tokens"] = isl + 1500
        opts["enable_mixed_chunk"] = mixed_chunk(row) if mixed is None else bool(mixed)
        out["scheduler.engine_options"] = opts
    elif engine == "trtllm":
        out["scheduler.max_num_batched_tokens"] = (bs + isl + 1500 + 31) // 32 * 32 * dp
    else:
        raise ValueError(f"engine must be 'vllm', 'sglang' or 'trtllm', got {engine!r}")
    return out
