"""The pictures of docs/observability.md, made from the files a run writes, read back with the real
tools where they exist.

- ``docs/img/perfetto_trace.png``: the Chrome/Perfetto trace of a small two-replica run, drawn
  from the trace file itself (each track a row, each span a bar, as a trace viewer lays it out).
- ``docs/img/prometheus_panels.png``: four dashboard panels of the same run's OpenMetrics file,
  backfilled into a real Prometheus TSDB with ``promtool`` and queried over HTTP with PromQL
  ``query_range`` (the queries the shipped Grafana dashboard uses).

    python -m tools.docs.observability_figures      # needs Debian's prometheus for the second
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import simsched
from simsched import SimConfig
from simsched.analysis.openmetrics import DEFAULT_EPOCH
from simsched.config import ClusterConfig

ROOT = Path(__file__).resolve().parents[2]
IMG = ROOT / "docs" / "img"
COLORS = {"queued": "0.75", "prefill": "tab:orange", "decode": "tab:blue", "output": "tab:green",
          "prefill+decode": "tab:purple", "step": "0.3"}


def the_run():
    cfg = SimConfig().replace(rate=30.0, num_requests=400, seed=5, preemption=True,
                              cluster=ClusterConfig(num_replicas=2))
    return simsched.simulate(cfg)


def trace_figure(trace: dict, path: Path, num_requests: int = 12) -> None:
    from matplotlib.figure import Figure

    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    names = {(e["pid"], e.get("tid")): e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    tracks = [(1, 0)] + sorted({(e["pid"], e["tid"]) for e in spans if e["pid"] == 1
                                and e["tid"] > 0})[:num_requests] + [(2, 0)]
    fig = Figure(figsize=(11, 4.8))
    ax = fig.add_subplot()
    limit = max(e["ts"] + e["dur"] for e in spans if (e["pid"], e["tid"]) in tracks[1:-1])
    for row, track in enumerate(tracks):
        for e in spans:
            if (e["pid"], e["tid"]) != track or e["ts"] > limit or e["name"] == "request":
                continue
            color = COLORS.get(e["name"], "tab:blue" if e.get("cat") == "iteration" else "0.5")
            ax.broken_barh([(e["ts"] / 1e3, max(e["dur"] / 1e3, 0.05))], (row - 0.4, 0.8),
                           color=color, linewidth=0)
    ax.set_yticks(range(len(tracks)))
    ax.set_yticklabels([f"replica {p - 1}: {names.get(t, '?')}" if t[1] == 0 else names.get(t, "?")
                        for p, t in ((t[0], t) for t in tracks)], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, limit / 1e3)
    ax.set_xlabel("simulated time (ms)")
    handles = [__import__("matplotlib.patches", fromlist=["Patch"]).Patch(color=c, label=n)
               for n, c in COLORS.items() if n != "step"]
    ax.legend(handles=handles, fontsize=7, loc="lower right", ncol=5)
    ax.set_title("Chrome/Perfetto trace (drawn from the trace file): iterations and requests",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def prometheus_figure(res, path: Path) -> bool:
    from matplotlib.figure import Figure

    from tools import prometheus_server

    if not prometheus_server.available():
        print("prometheus not installed: skipped", path.name)
        return False
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        res.to_openmetrics(tmp / "m.om", interval=0.5)
        with prometheus_server.serving(tmp / "m.om", tmp) as base:
            start, end = DEFAULT_EPOCH + 1.0, DEFAULT_EPOCH + res.sim_time
            panels = [
                ("requests running", "vllm:num_requests_running", "{instance}"),
                ("KV-cache usage", "vllm:kv_cache_usage_perc", "{instance}"),
                ("generation tokens/s", "sum(rate(vllm:generation_tokens_total[2s]))", "all"),
                ("TTFT p99 (s)", "histogram_quantile(0.99, sum by (le) "
                 "(rate(vllm:time_to_first_token_seconds_bucket[4s])))", "p99")]
            fig = Figure(figsize=(11, 5))
            for k, (title, expr, label) in enumerate(panels):
                ax = fig.add_subplot(2, 2, k + 1)
                for series in prometheus_server.query_range(base, expr, start, end, 0.5):
                    t = [float(v[0]) - DEFAULT_EPOCH for v in series["values"]]
                    y = [float(v[1]) for v in series["values"]]
                    ax.plot(t, y, lw=1, label=label.format(**series["metric"]))
                ax.set_title(f"{title}: {expr}", fontsize=7)
                ax.grid(alpha=0.3)
                ax.legend(fontsize=7)
            fig.supxlabel("simulated time (s)", fontsize=8)
            fig.tight_layout()
            fig.savefig(path, dpi=90)
    return True


def main() -> int:
    IMG.mkdir(parents=True, exist_ok=True)
    res = the_run()
    from simsched.analysis.perfetto import chrome_trace

    trace_figure(chrome_trace(res), IMG / "perfetto_trace.png")
    print("wrote", IMG / "perfetto_trace.png")
    if prometheus_figure(res, IMG / "prometheus_panels.png"):
        print("wrote", IMG / "prometheus_panels.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
