"""Prometheus metrics of a simulated run (issue 46, item 2): vLLM's names and buckets, values that
are the frames', and a real Prometheus answering PromQL over the backfilled series."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import simsched
from simsched import SimConfig
from simsched.analysis.openmetrics import (DEFAULT_EPOCH, TIME_TO_FIRST_TOKEN_BUCKETS, collect,
                                           openmetrics_text, request_tokens_buckets)
from simsched.config import ClusterConfig

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def run():
    cfg = SimConfig().replace(rate=40.0, num_requests=300, seed=4, enable_prefix_caching=True,
                              cluster=ClusterConfig(num_replicas=2))
    return simsched.simulate(cfg)


def test_final_values_are_the_frames(run):
    data = collect(run, interval=0.5)
    fam = data["families"]
    reqs = run.requests
    for r in (0, 1):
        mine = reqs[reqs["replica"] == r]
        assert fam["vllm:generation_tokens"][2][r][-1] == mine["num_generated_tokens"].sum()
        assert fam["vllm:prompt_tokens"][2][r][-1] == mine["num_prompt_tokens"].sum()
        assert fam["vllm:request_success"][2][r][-1] == (mine["status"] == "finished").sum()
        assert fam["vllm:prefix_cache_hits"][2][r][-1] == mine["num_cached_tokens"].sum()
        ttft = fam["vllm:time_to_first_token_seconds"][2][r]
        assert ttft["count"][-1] == mine["ttft"].notna().sum()
        assert ttft["sum"][-1] == pytest.approx(mine["ttft"].sum())
        le_01 = dict((le, c) for le, c in ttft["buckets"])[0.1]
        assert le_01[-1] == (mine["ttft"] <= 0.1).sum()
    itl = [fam["vllm:inter_token_latency_seconds"][2][r] for r in (0, 1)]
    assert sum(h["count"][-1] for h in itl) == run.num_itl_samples
    assert sum(h["sum"][-1] for h in itl) == pytest.approx(run.itl_samples().sum())
    # cumulative series never decrease; gauges are counts at each scrape
    for name, (kind, _, per) in fam.items():
        if kind == "counter":
            for values in per.values():
                assert (np.diff(values) >= 0).all(), name
    t = data["scrapes"][3]
    mine = reqs[reqs["replica"] == 0]
    running = ((mine["first_scheduled_at"] <= t) & ~(mine["engine_finished_at"] <= t)).sum()
    assert fam["vllm:num_requests_running"][2][0][3] == running


def test_text_is_openmetrics_with_vllm_names(run):
    text = openmetrics_text(run, interval=1.0)
    assert text.endswith("# EOF\n")
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, flags=re.M))
    assert types["vllm:prompt_tokens"] == "counter"
    assert types["vllm:kv_cache_usage_perc"] == "gauge"
    assert types["vllm:e2e_request_latency_seconds"] == "histogram"
    assert re.search(r'^vllm:prompt_tokens_total\{engine="0",instance="replica-1",job="simsched",'
                     r'model_name="[^"]+"\} \d', text, flags=re.M)
    les = re.findall(r'vllm:time_to_first_token_seconds_bucket\{[^}]*instance="replica-0"[^}]*'
                     r'le="([^"]+)"\} \S+ ' + re.escape(repr(DEFAULT_EPOCH + 1.0)), text)
    assert les == [repr(float(b)) for b in TIME_TO_FIRST_TOKEN_BUCKETS] + ["+Inf"]


def test_request_token_buckets_follow_vllm():
    assert request_tokens_buckets(100) == (1, 2, 5, 10, 20, 50, 100)
    assert request_tokens_buckets(4096)[-1] == 2000


@pytest.mark.parametrize("interval", [0, -1.0, float("nan"), "1", True])
def test_bad_interval_is_refused(run, interval):
    with pytest.raises(ValueError, match="interval"):
        collect(run, interval)


def test_too_many_scrapes_are_refused(run):
    with pytest.raises(ValueError, match="1,000,000"):
        collect(run, 1e-9)


def test_grafana_dashboard_reads_exported_series(run):
    dashboard = json.loads((ROOT / "docs" / "grafana" / "simsched-vllm.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 6
    text = openmetrics_text(run)
    exported = set(re.findall(r"^(vllm:[a-z0-9_:]+?)(?:_bucket|_count|_sum)?\{", text, flags=re.M))
    for expr in exprs:
        for name in re.findall(r"vllm:[a-z0-9_:]+", expr):
            base = re.sub(r"_(bucket|count|sum)$", "", name)
            assert name in exported or base in exported, f"{name} in the dashboard is not exported"


@pytest.fixture(scope="module")
def prometheus(run, tmp_path_factory):
    from tools import prometheus_server

    if not prometheus_server.available():
        pytest.skip("Prometheus is not installed (Debian: apt-get install prometheus; .ci/run "
                    "installs it)")
    root = tmp_path_factory.mktemp("prom")
    (root / "metrics.om").write_text(openmetrics_text(run, interval=0.5))
    with prometheus_server.serving(root / "metrics.om", root) as base:
        yield base


def _query(base: str, expr: str, at: float) -> list:
    from tools import prometheus_server

    return prometheus_server.query(base, expr, at)


def test_promql_answers_match_the_frames(run, prometheus):
    scrapes = collect(run, 0.5)["scrapes"]
    at = DEFAULT_EPOCH + float(scrapes[-1])
    ttft = run.requests["ttft"].dropna().to_numpy()
    [count] = _query(prometheus, "sum(vllm:time_to_first_token_seconds_count)", at)
    assert float(count["value"][1]) == len(ttft)
    [below] = _query(prometheus, 'sum(vllm:time_to_first_token_seconds_bucket{le="0.1"})', at)
    assert float(below["value"][1]) == (ttft <= 0.1).sum()
    [gen] = _query(prometheus, "sum(vllm:generation_tokens_total)", at)
    assert float(gen["value"][1]) == run.requests["num_generated_tokens"].sum()
    [q99] = _query(prometheus, "histogram_quantile(0.99, sum by (le) "
                               "(vllm:time_to_first_token_seconds_bucket))", at)
    bounds = (0.0,) + TIME_TO_FIRST_TOKEN_BUCKETS
    true_p99 = np.percentile(ttft, 99)
    k = int(np.searchsorted(bounds, true_p99))       # the bucket holding the true p99
    assert bounds[k - 1] <= float(q99["value"][1]) <= bounds[k]
    # a gauge at one scrape: requests running on replica 0
    t = float(scrapes[4])
    mine = run.requests[run.requests["replica"] == 0]
    running = ((mine["first_scheduled_at"] <= t) & ~(mine["engine_finished_at"] <= t)).sum()
    [gauge] = _query(prometheus, 'vllm:num_requests_running{instance="replica-0"}',
                     DEFAULT_EPOCH + t)
    assert float(gauge["value"][1]) == running
