"""The benchmarks' latest figures: recorded by the scripts, rendered into benchmarks/README.md.

Each script run with ``--record`` writes what it measured to ``benchmarks/results/NAME.json``
(one entry per variant, e.g. ``full`` and ``instructions``: the figures plus when, on which commit
and with which Python they were measured) and re-renders the table. :data:`BENCHMARKS` says, per
script, how to run it, what it measures, its target, how its figures read and whether they meet
the target. The table is a generated block of ``benchmarks/README.md`` (and the summary one of
``docs/performance.md``), checked by ``tools.docs.check_docs`` and the test suite::

    python -m benchmarks.results            # re-render both blocks from the recorded figures
    python -m benchmarks.results --check    # exit 1 when a block differs from the figures

History (earlier figures, what changed them) is in CHANGELOG.md, not here.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

# The sharded runs' block (re-exported: benchmarks.shards and the tests read the projection here).
from benchmarks.results_shards import (DAY, day_projection, projection_text,  # noqa: F401
                                       render_shards, shard_bound)

ROOT = Path(__file__).resolve().parent.parent
# Overridable so that tests record into a temporary folder.
RESULTS_DIR = Path(os.environ.get("SIMSCHED_BENCH_RESULTS", ROOT / "benchmarks" / "results"))
META = ("measured", "commit", "python", "argv")


@dataclass(frozen=True)
class Benchmark:
    """One row of the table.

    ``current`` is a :meth:`str.format` template over the recorded variants (``{full[wall_s]}``
    reads variant ``full``'s figure ``wall_s``); ``status`` maps the variants to the status text
    (``met`` / ``not met`` and why), or is a fixed text where the target is not a number.
    """

    command: str
    measures: str
    target: str
    current: str
    status: Callable[[dict], str] | str


def _met(ok: bool, what: str = "") -> str:
    text = "met" if ok else "**not met**"
    return f"{what} {text}".strip()


BENCHMARKS: dict[str, Benchmark] = {
    "trace_replay": Benchmark(
        "`python -m benchmarks.trace_replay [--quick]`",
        "the one-hour Azure conversation trace (19,366 requests, 3.98 M output tokens) on "
        "Llama-2-7B / one A100-80GB, calibrated cost model, every metric recorded: wall time, "
        "× real time, µs per iteration, SimPy wake-ups per request; FCFS, SPF with preemption, "
        "FCFS at 4× speed",
        "FCFS ≤ 3 s wall",
        "FCFS {full[fcfs_wall_s]:.2f} s ({full[fcfs_x_real_time]:,.0f}× real time, "
        "{full[fcfs_iterations]:,} iterations, {full[fcfs_us_per_iteration]:.1f} µs/iteration, "
        "{full[fcfs_wakeups_per_request]:.2f} wake-ups/request); SPF+preemption "
        "{full[spf_preemption_wall_s]:.2f} s ({full[spf_preemption_wakeups_per_request]:.2f} "
        "wake-ups/request); FCFS at 4× {full[fcfs_4x_wall_s]:.2f} s",
        lambda r: _met(r["full"]["fcfs_wall_s"] <= 3)),
    "scaling": Benchmark(
        "`python -m benchmarks.scaling [--quick]`",
        "per-iteration wall time of the iteration loop alone with 1,000 vs 100,000 requests "
        "waiting (all arrive at t=0; the run stops at a simulated-time limit)",
        "ratio ≤ 2",
        "FCFS {full[fcfs_small_us]:.1f} → {full[fcfs_large_us]:.1f} µs/iteration (ratio "
        "{full[fcfs_ratio]:.2f}); SPF+preemption {full[spf_preemption_small_us]:.1f} → "
        "{full[spf_preemption_large_us]:.1f} µs (ratio {full[spf_preemption_ratio]:.2f})",
        lambda r: _met(max(r["full"]["fcfs_ratio"], r["full"]["spf_preemption_ratio"]) <= 2)),
    "overload": Benchmark(
        "`python -m benchmarks.overload [--quick]`",
        "for every queue policy, admission preemption off and on: simulator CPU time per "
        "*finished* request over the same 2,000-iteration window with 1,000 vs 100,000 "
        "ShareGPT-length requests waiting at t=0 (Llama-2-7B, A100-80GB, 256 sequences; best "
        "of 2)",
        "ratio ≤ 1.5 for every row",
        "worst ratio {full[worst_ratio]:.2f} ({full[worst_policy]}, preemption "
        "{full[worst_preemption]}) over {full[rows]} rows; {full[wall_s]:.0f} s",
        lambda r: _met(r["full"]["worst_ratio"] <= 1.5)),
    "floor": Benchmark(
        "`python -m benchmarks.floor [--quick] [--repeat N] [--instructions]`",
        "simsched's iteration loop against a bare lazy-decode SimPy loop (FCFS, chunked "
        "prefill, KV reserved at admission, first-token and finish times only) on the Azure "
        "conversation trace with the calibrated model, both timed between their first and last "
        "cost-model call; `--instructions`: one call of each under cachegrind (needs valgrind)",
        "≤ 1.5×",
        "full hour {full[ratio]:.2f}× wall (best of {full[repeat]}); first 600 s "
        "{quick[ratio]:.2f}× ({quick[simsched_us_per_iteration]:.1f} vs "
        "{quick[floor_us_per_iteration]:.1f} µs/iteration, best of {quick[repeat]}); "
        "instructions {instructions[simsched_instructions_m]:,.1f} M vs "
        "{instructions[floor_instructions_m]:,.1f} M ({instructions[instructions_ratio]:.2f}×), "
        "D1 misses {instructions[d1_ratio]:.2f}×, mispredicted branches "
        "{instructions[mispredicts_ratio]:.2f}× (`--quick`)",
        lambda r: _met(max(r["full"]["ratio"], r["quick"]["ratio"]) <= 1.5)),
    "memory": Benchmark(
        "`python -m benchmarks.memory [--num-requests N]`",
        "peak RSS of one run of 1,000,000 lesson requests (40 req/s, 256 sequences), "
        "`summary()` included",
        "≤ 512 MiB",
        "**{plain[peak_rss_mib]:.0f} MiB** with the plain install, **{pyarrow[peak_rss_mib]:.0f} "
        "MiB** with pyarrow installed; {plain[output_tokens_m]:.1f} M output tokens, "
        "{plain[iterations_m]:.2f} M iterations; wall {plain[wall_s]:.0f} s",
        lambda r: _met(max(r["plain"]["peak_rss_mib"], r["pyarrow"]["peak_rss_mib"]) <= 512)),
    "sweep_memory": Benchmark(
        "`python -m benchmarks.sweep_memory [--runs N] [--num-requests N] [--workers N]`",
        "resident memory of a sweep's parent: 8 runs of 100,000 lesson requests on 2 workers, "
        "then the combined `requests` and `iterations` frames",
        "one copy of each frame",
        "parent {full[after_sweep_mib]:.0f} MiB after the sweep, **{full[with_frames_mib]:.0f} "
        "MiB** with the combined frames ({full[rows_m]:.1f} M rows), peak {full[peak_mib]:.0f} MiB",
        "met"),
    "prefix_cache": Benchmark(
        "`python -m benchmarks.prefix_cache [--quick]`",
        "CPU seconds (best of 3) of replays with prefix caching off vs on: the Mooncake "
        "synthetic trace (Llama-3.1-8B / A100) at its recorded rate and at 0.5 req/s, and the "
        "Azure conversation trace (no hashes); µs per cache lookup of a 1,000-block prompt "
        "against caches of 10^3–10^6 blocks",
        "Mooncake on ≤ 2× off; Azure on ≤ 1.1× off; lookup flat in cache size",
        "Mooncake {full[mooncake]:.2f}× ({full[mooncake_0.5]:.2f}× at 0.5 req/s); Azure conv "
        "{full[azure_conv]:.2f}×; lookup {full[lookup_us_min]:.1f}–{full[lookup_us_max]:.1f} µs "
        "from 10^3 to 10^6 blocks",
        lambda r: _met(r["full"]["mooncake"] <= 2 and r["full"]["azure_conv"] <= 1.1
                       and r["full"]["lookup_us_max"] <= 1.25 * r["full"]["lookup_us_min"])),
    "startup": Benchmark(
        "`python -m benchmarks.startup [--quick] [--repeat N]`",
        "a fresh process (a sweep worker): `import simsched`, then time to the first "
        "`iteration_time` of a calibrated model (reading the shipped fits), a 200-request run, "
        "and what refitting would cost",
        "a worker starts without refitting",
        "first iteration {full[first_iteration_ms_min]:.0f}–{full[first_iteration_ms_max]:.0f} "
        "ms after import; a refit would cost {full[refit_ms_min]:.0f}–{full[refit_ms_max]:.0f} "
        "ms",
        lambda r: _met(r["full"]["first_iteration_ms_max"] < r["full"]["refit_ms_min"])),
    "cluster": Benchmark(
        "`python -m benchmarks.cluster [--quick] [--router R] [--instructions] "
        "[--num-requests N] [--no-floor]`",
        "a 64-replica cluster (JSQ) and one replica, each replaying 1,000,000 lesson requests "
        "at 80 % of capacity: CPU µs per simulated iteration and per request, cluster peak RSS; "
        "then the same two runs in `floor.py`'s bare loop, and simsched's ratios over its "
        "(docs/cluster.md); `--instructions`: both simsched runs under cachegrind",
        "ratios ≤ 1.3, peak < 1 GB",
        "**{full[ratio_iteration]:.2f}× / {full[ratio_request]:.2f}×** per iteration / request "
        "({full[cluster_us_per_iteration]:.1f} vs {full[single_us_per_iteration]:.1f} "
        "µs/iteration); the bare loop {full[floor_ratio_iteration]:.2f}× / "
        "{full[floor_ratio_request]:.2f}×; peak RSS {full[peak_rss_mib]:.0f} MiB; "
        "instructions per request {instructions[ratio_request]:.2f}× "
        "({instructions[num_requests]:,} requests)",
        lambda r: (_met(max(r["full"]["ratio_iteration"], r["full"]["ratio_request"]) <= 1.3,
                        "time") + " (out of reach on this machine: the bare loop's own ratio "
                                  "is above it); " + _met(r["full"]["peak_rss_mib"] < 1e9 / 2**20,
                                                          "memory"))),
    "prefix_routing": Benchmark(
        "`python -m benchmarks.prefix_routing [--replicas N] [--num-requests N]`",
        "`prefix_affinity` on 64 replicas with prefix caching (40,000 shared-prefix requests, "
        "256 groups of a 1,024-token system prompt): CPU of the whole run with the prefix index "
        "and scoring every replica; checks both route identically",
        "index cheaper, same routing",
        "{full[with_index_s]:.2f} s with the index, {full[without_index_s]:.2f} s scoring every "
        "replica (**{full[ratio]:.2f}×**); hit rate {full[prefix_hit_rate]:.3f}",
        lambda r: _met(r["full"]["ratio"] > 1 and r["full"]["same_routing"])),
    "vllm_parity": Benchmark(
        "`VLLM_TARGET_DEVICE=cpu python -m benchmarks.vllm_parity --cases 1000 --mode both "
        "[--ablate] [--seed S]` (needs vLLM on CPU: docs/validation.md)",
        "vLLM's own `Scheduler` and `AsyncScheduler` against simsched on seeded cases in every "
        "family, step by step (docs/parity.md); `--ablate`: each vLLM rule set back to "
        "simsched's classic value",
        "every case identical",
        "seed 4041: {seed4041[sync][identical]:,} of {seed4041[sync][cases]:,} (sync) and "
        "{seed4041[async][identical]:,} of {seed4041[async][cases]:,} (async) cases identical, "
        "steps and effects ({seed4041[sync][steps]:,} and {seed4041[async][steps]:,} steps); "
        "seed 4042: {seed4042[sync][identical]:,} and {seed4042[async][identical]:,} of "
        "{seed4042[sync][cases]:,}",
        lambda r: _met(all(v[m]["identical"] == v[m]["cases"] for v in r.values()
                           for m in ("sync", "async")))),
    "fleet_day": Benchmark(
        "`python -m benchmarks.fleet_day [--replicas 64] [--hours 24] [--utilisation 0.5] "
        "[--autoscale] [--start-hour H] [--loop simsched\\|floor\\|both] [--shards N]`",
        "a streamed (`stream_to`) ServeGen `m-large` day on a 64-replica fleet (Llama-2-7B / "
        "A100-80GB, `least_tokens`) at a mean utilisation: requests, iterations, wall time, µs "
        "per request and per iteration, peak RSS; `--loop floor` replays the same requests in "
        "`floor.py`'s bare SimPy loop; `--shards N` compares one process with N shards "
        "(`shards.py` records such runs)",
        "a day (≥ 10 M requests) ≤ 15 min on one core, ≤ 1 GB",
        "**{full[wall_s]:,.1f} s** for {full[requests]:,} requests ({full[us_per_request]:.1f} "
        "µs per request, {full[us_per_iteration]:.2f} µs per iteration), peak RSS "
        "{full[peak_rss_mib]:.0f} MiB; the bare SimPy loop on the same requests "
        "{floor[wall_s]:,.1f} s",
        lambda r: (_met(r["full"]["wall_s"] <= 900, "time")
                   + " (blocked: below what a bare SimPy loop costs on this machine); "
                   + _met(r["full"]["peak_rss_mib"] <= 1024, "memory"))),
    "router_cost": Benchmark(
        "`python -m benchmarks.router_cost [--routers jsq llm-d] [--num-requests N] "
        "[--repeat K] [--instructions]`",
        "`cluster.py`'s 64-replica run (lesson workload, 80 % load, exact state) per router: "
        "CPU µs per request (best of K, the routers alternating) and the part in the router's "
        "`choose`; `--instructions`: instructions per request under cachegrind (docs/llm_d.md)",
        "llm-d's default profile ≤ 1.2× `jsq` per request",
        "llm-d **{cpu[routers][llm-d][us_per_request]:.1f}** vs jsq "
        "{cpu[routers][jsq][us_per_request]:.1f} µs/request CPU ({cpu[routers][llm-d][choose_us_"
        "per_request]:.1f} vs {cpu[routers][jsq][choose_us_per_request]:.1f} in `choose`); "
        "instructions {instructions[routers][llm-d][instructions]:,} vs "
        "{instructions[routers][jsq][instructions]:,} per request",
        lambda r: _met(r["cpu"]["routers"]["llm-d"]["us_per_request"]
                       <= 1.2 * r["cpu"]["routers"]["jsq"]["us_per_request"], "time")
        + "; " + _met(r["instructions"]["routers"]["llm-d"]["instructions"]
                      <= 1.2 * r["instructions"]["routers"]["jsq"]["instructions"],
                      "instructions")),
    "shards": Benchmark(
        "`python -m benchmarks.shards [--replicas 64 256 1024] [--shards 2 4] [--hours H] "
        "[--workers process\\|ray] [--repeat K] [--round-trip]`",
        "`fleet_day.py`'s fleet (`least_tokens` on a 50 ms snapshot) in one process and in N "
        "shards (`simulate(..., shards=N)`: local worker processes or Ray actors), a slice of "
        "the day: wall and CPU times, speed-up, windows synchronised and their cost, each "
        "shard's peak RSS, the machine's load; a 1,000-replica day on 16 Ray nodes projected "
        "from the per-window costs (docs/cluster.md)",
        "2 shards ≥ 1.6× one process on the 64-replica day, ≤ 1 GB per process",
        "2 shards on 64 replicas: **{r64_s2_process[speedup]:.2f}×** "
        "({r64_s2_process[one_wall_s]:.1f} s → {r64_s2_process[wall_s]:.1f} s for a "
        "{r64_s2_process[hours]:g} h slice, best of {r64_s2_process[repeat]}, load average "
        "{r64_s2_process[load_before]:.1f} on 2 cores), {r64_s2_process[sync_us_per_window]:,.0f} "
        "µs per window synchronised; peak RSS per process ≤ "
        "{r64_s2_process[max_rss]:.0f} MiB",
        lambda r: (_met(r["r64_s2_process"]["speedup"] >= 1.6, "time")
                   + (" (windows are lockstep: the slowest shard's work per window, summed, "
                      f"allows {shard_bound(r['r64_s2_process']):.2f}× with free "
                      "synchronisation and routing)" if r["r64_s2_process"]["speedup"] < 1.6
                      else "")
                   + "; " + _met(r["r64_s2_process"]["max_rss"] <= 1024, "memory"))),
    "bytecodes": Benchmark(
        "`python -m benchmarks.bytecodes [--hours 0.02] [--start-hour 14] [--top 25]`",
        "the bytecodes `simulate` executes in a fleet-day slice, by function and package, per "
        "request and per iteration (`sys.settrace`, hash seeds fixed: the same counts on any "
        "machine for one Python version)",
        "— (where the interpreter's work goes)",
        "{full[bytecodes_per_request]:,.0f} per request, {full[bytecodes_per_iteration]:,.0f} "
        "per iteration ({full[requests]:,} requests at the 14th hour; Python {full[python]}); "
        "half in {full[half_functions]} functions",
        "—"),
    "instructions": Benchmark(
        "`python -m benchmarks.instructions [--base REV] [--hours 0.05] [--start-hour 14]`",
        "instructions executed (cachegrind, hash seeds fixed) by a fleet-day slice in the "
        "working tree and at `--base`",
        "— (compares a change of a few per cent)",
        "{full[base_g]:.3f} → {full[here_g]:.3f} G instructions ({full[change]:+.1%}) against "
        "{full[base]}",
        "—"),
    "fuzz": Benchmark(
        "`python -m benchmarks.fuzz --n 10000 --workers 2 --seed 0 [--cluster P]`",
        "random configurations × adversarial workloads with every invariant checked; "
        "`--cluster P`: a share P of the cases also run as clusters with shared prefixes",
        "0 failures",
        "{full[cases]:,} configurations, {full[failures]} failures ({full[wall_s]:.0f} s); "
        "{cluster[cases]:,} cluster cases, {cluster[failures]} failures",
        lambda r: _met(r["full"]["failures"] == 0 and r["cluster"]["failures"] == 0)),
}


def path_of(name: str) -> Path:
    """The results file of script ``name``."""
    return RESULTS_DIR / f"{name}.json"


def load(name: str) -> dict:
    """Every recorded variant of script ``name``."""
    data = json.loads(path_of(name).read_text())
    if name == "shards":                # (a figure the row reads: the largest process)
        for v in data.values():
            v["max_rss"] = max(v["shard_peak_rss_mib"])
    return data


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def record(name: str, variant: str, figures: dict, render: bool = True) -> Path:
    """Write ``figures`` as variant ``variant`` of ``name``'s results (others are kept), with
    today's date, the commit and the Python; then re-render the docs' blocks."""
    if name not in BENCHMARKS:
        raise ValueError(f"no benchmark {name!r} in benchmarks.results.BENCHMARKS")
    path = path_of(name)
    data = json.loads(path.read_text()) if path.exists() else {}
    data[variant] = {"measured": datetime.date.today().isoformat(), "commit": _commit(),
                     "python": platform.python_version(), "argv": sys.argv[1:], **figures}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"recorded {name} ({variant}) in {path}")
    if render:
        main([])
    return path


def status_of(name: str, recorded: dict) -> str:
    status = BENCHMARKS[name].status
    return status if isinstance(status, str) else status(recorded)


def _measured(recorded: dict) -> str:
    dates = sorted({v["measured"] for v in recorded.values()})
    return dates[-1] if len(dates) == 1 else f"{dates[0]} – {dates[-1]}"


def current(name: str, recorded: dict | None = None) -> str:
    """The current-figure text of ``name`` from its recorded variants."""
    recorded = load(name) if recorded is None else recorded
    return BENCHMARKS[name].current.format(**recorded)


def table() -> str:
    """benchmarks/README.md's table, from the recorded results."""
    lines = ["| script | command | what it measures | target | current figure | status | "
             "measured |", "|---|---|---|---|---|---|---|"]
    for name, b in BENCHMARKS.items():
        recorded = load(name)
        lines.append(f"| `{name}.py` | {b.command} | {b.measures} | {b.target} | "
                     f"{current(name, recorded)} | {status_of(name, recorded)} | "
                     f"{_measured(recorded)} |")
    return "\n".join(lines) + "\n"


def summary() -> str:
    """docs/performance.md's list: one line per benchmark with a target."""
    lines = []
    for name, b in BENCHMARKS.items():
        if b.target.startswith("—"):
            continue
        recorded = load(name)
        lines.append(f"- **`{name}`** (target {b.target}: {status_of(name, recorded)}): "
                     f"{current(name, recorded)}.")
    return "\n".join(lines) + "\n"


def cluster_table() -> str:
    """docs/cluster.md's speed table: the cluster benchmark's latest run."""
    r = load("cluster")
    f, i = r["full"], r["instructions"]
    peak = f["peak_rss_mib"]
    rows = [("64 replicas", f["cluster_iterations"], f["cluster_us_per_iteration"],
             f["cluster_us_per_request"], f"{peak:.0f} MiB ({peak * 2**20 / 1e9:.2f} GB)"),
            ("1 replica", f["single_iterations"], f["single_us_per_iteration"],
             f["single_us_per_request"], ""),
            ("ratio", None, f["ratio_iteration"], f["ratio_request"],
             _met(peak < 1e9 / 2**20, "target < 1 GB:")),
            ("bare loop, 64 replicas", f["floor_cluster_iterations"],
             f["floor_cluster_us_per_iteration"], f["floor_cluster_us_per_request"], ""),
            ("bare loop, 1 replica", f["floor_single_iterations"],
             f["floor_single_us_per_iteration"], f["floor_single_us_per_request"], ""),
            ("bare loop's ratio", None, f["floor_ratio_iteration"], f["floor_ratio_request"], "")]
    lines = ["| | iterations | µs per iteration | µs per request | peak RSS |",
             "|---|---|---|---|---|"]
    for name, n, it, req, extra in rows:
        if n is None:
            lines.append(f"| {name} | | **{it:.2f}×** | **{req:.2f}×** | {extra} |")
        else:
            lines.append(f"| {name} | {n:,} | {it:.1f} | {req:.1f} | {extra} |")
    return ("\n".join(lines) + "\n\n"
            f"simsched's ratios are {f['ratio_iteration'] / f['floor_ratio_iteration']:.2f}× and "
            f"{f['ratio_request'] / f['floor_ratio_request']:.2f}× the bare loop's. Counted "
            f"under cachegrind (`--instructions`, "
            f"{i['num_requests']:,} requests), a request costs "
            f"{i['cluster_instructions_per_request'] / 1e3:.1f} k instructions on 64 replicas and "
            f"{i['single_instructions_per_request'] / 1e3:.1f} k on one, "
            f"{i['ratio_request']:.2f}×.\n")


def parity_summary() -> str:
    """docs/validation.md's sentence: the parity harness's latest runs against vLLM."""
    r = load("vllm_parity")
    parts = []
    for variant, v in sorted(r.items()):
        parts.append(f"seed {v['seed']}: {v['sync']['identical']:,} of {v['sync']['cases']:,} "
                     f"cases identical against `Scheduler` ({v['sync']['steps']:,} steps) and "
                     f"{v['async']['identical']:,} of {v['async']['cases']:,} against "
                     f"`AsyncScheduler` ({v['async']['steps']:,} steps), steps and effects "
                     f"(free KV blocks, evictions, preemptions per request) alike")
    versions = sorted({v["vllm_version"] for v in r.values()})
    return f"Against vLLM {', '.join(versions)}: " + "; ".join(parts) + ".\n"


def prefix_cache_speed() -> str:
    """docs/prefix_caching.md's sentence: the prefix-cache benchmark's latest run."""
    f = load("prefix_cache")["full"]
    return (f"Caching on costs {f['mooncake']:.2f}× caching off on the Mooncake synthetic trace "
            f"at its recorded rate (3,993 requests, Llama-3.1-8B, A100; target ≤ 2×) and "
            f"{f['mooncake_0.5']:.2f}× at 0.5 req/s; {f['azure_conv']:.2f}× on the Azure "
            f"conversation trace, whose requests carry no hashes (target ≤ 1.1×). A lookup costs "
            f"{f['lookup_us_min']:.1f}–{f['lookup_us_max']:.1f} µs against caches of 10^3 to "
            f"10^6 blocks. Targets: {status_of('prefix_cache', load('prefix_cache'))}.\n")


def shards_table() -> str:
    """docs/cluster.md's table of sharded runs and the day's projection."""
    return render_shards(load("shards"))


BLOCK_NAMES = ("benchmarks-table", "performance-figures", "cluster-speed", "validation-parity",
               "prefix-cache-speed", "cluster-shards", "llm-d-cost")


def main(argv=None) -> int:
    """Re-render (or with --check, compare) the docs' blocks of recorded figures."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m benchmarks.results",
                                description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="compare only; exit 1 on a difference")
    args = p.parse_args(argv)
    from tools.docs import check_docs

    problems = check_docs.check(list(BLOCK_NAMES), update=not args.check)
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
