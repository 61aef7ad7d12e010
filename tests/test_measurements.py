"""Reading a user's own measurements (issue 42, item 1): vllm bench serve JSON, vllm serve command
lines and TOML, run tables, Prometheus scrapes; bad input names the file and key or line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import simsched
from simsched import SimConfig
from simsched.analysis import prometheus_text as prom
from simsched.analysis.measurements import (read_run_tables, read_serve_command,
                                            read_settings_toml, read_vllm_bench)
from simsched.analysis.openmetrics import openmetrics_text

ROOT = Path(__file__).resolve().parent.parent
VLLM_015 = ROOT.parent / "shared" / "data" / "real-serving" / "vllm-0.15"


@pytest.fixture(scope="module")
def run():
    return simsched.simulate(SimConfig().replace(num_requests=200, rate=20.0, seed=3))


def test_bench_json_round_trips(run, tmp_path):
    run.to_vllm_bench(tmp_path / "b.json", percentiles=(50, 90, 99))
    m = read_vllm_bench(tmp_path / "b.json")
    s = run.summary()
    for key in ("ttft_mean", "ttft_p99", "tpot_mean", "itl_mean", "e2el_p90"):
        assert m.metrics[key] == pytest.approx(s[key], rel=1e-12), key
    assert m.metrics["num_finished"] == s["num_finished"]
    assert m.requests is None and m.settings["backend"] == "simsched"


def test_bench_json_detailed(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"completed": 2, "duration": 3.0, "mean_ttft_ms": 150.0,
                                "input_lens": [10, 20], "output_lens": [5, 6],
                                "ttfts": [0.1, 0.2], "itls": [[0.01, 0.03], [0.02]]}))
    m = read_vllm_bench(path)
    assert m.metrics["ttft_mean"] == 0.15
    assert m.requests["num_prompt_tokens"].tolist() == [10, 20]
    assert m.requests["itl_mean"].tolist() == pytest.approx([0.02, 0.02])
    bad = json.loads(path.read_text())
    bad["ttfts"] = [0.1]
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="ttfts has 1 entries, input_lens 2"):
        read_vllm_bench(path)


@pytest.mark.parametrize("content, match", [
    ({"duration": 1.0, "mean_ttft_ms": 1.0}, "missing key 'completed'"),
    ({"completed": 1, "duration": 1.0, "mean_ttft_ms": "fast"}, "mean_ttft_ms must be a number"),
    ([1, 2], "expected a JSON object")])
def test_bench_json_refuses_bad_files(tmp_path, content, match):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(content))
    with pytest.raises(ValueError, match=match) as info:
        read_vllm_bench(path)
    assert str(path) in str(info.value)


def test_bench_json_not_json(tmp_path):
    path = tmp_path / "x.json"
    path.write_text("{nope")
    with pytest.raises(ValueError, match="not JSON"):
        read_vllm_bench(path)


def test_serve_command():
    s = read_serve_command("vllm serve meta-llama/Llama-3.1-8B-Instruct -tp 2 --max-num-seqs 256 "
                           "--max-num-batched-tokens=8192 --kv-cache-dtype fp8 "
                           "--no-enable-prefix-caching --trust-remote-code --port 8000")
    assert s["model"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert (s["tensor_parallel_size"], s["max_num_seqs"], s["max_num_batched_tokens"]) == (2, 256, 8192)
    assert s["kv_cache_dtype"] == "fp8" and s["enable_prefix_caching"] is False
    assert s["other"] == {"--trust-remote-code": True, "--port": "8000"}
    with pytest.raises(ValueError, match="--max-num-seqs 'many' is not an integer"):
        read_serve_command("vllm serve m --max-num-seqs many")
    with pytest.raises(ValueError, match="--tensor-parallel-size needs a value"):
        read_serve_command("vllm serve m --tensor-parallel-size")
    with pytest.raises(ValueError, match="no model"):
        read_serve_command("vllm serve --max-num-seqs 4")


def test_settings_toml(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('[server]\nmodel = "llama-2-7b"\ngpu = "h100-sxm"\nmax_num_seqs = 128\n'
                    'gpu_memory_utilization = 1\nenable_prefix_caching = true\nnum_blocks = 7463\n')
    s = read_settings_toml(path)
    assert s["num_blocks"] == 7463 and s["gpu_memory_utilization"] == 1.0
    path.write_text('model = "x"\nmax_num_seq = 4\n')
    with pytest.raises(ValueError, match="unknown key 'max_num_seq'"):
        read_settings_toml(path)
    path.write_text('model = "x"\nmax_num_seqs = "4"\n')
    with pytest.raises(ValueError, match="max_num_seqs must be int"):
        read_settings_toml(path)


def test_run_tables_of_the_real_runs():
    if not VLLM_015.is_dir():
        pytest.skip("the shared data folder is not beside the project")
    runs = read_run_tables(VLLM_015 / "runs.csv", VLLM_015 / "measured.csv")
    assert len(runs) == 17
    for m in runs:
        assert set(m.metrics) == {"ttft_mean", "ttft_p90", "ttft_p99", "e2el_mean", "e2el_p90",
                                  "e2el_p99", "itl_mean"}
        assert 0 < m.metrics["ttft_mean"] < m.metrics["e2el_mean"]


def test_run_tables_refuse_bad_rows(tmp_path):
    (tmp_path / "runs.csv").write_text("experiment,model,gpu,tp\na,llama-2-7b,h100,1\n")
    (tmp_path / "m.csv").write_text("experiment,metric,measured_ms\nb,ttft_mean,1.0\n")
    with pytest.raises(ValueError, match="experiment 'b' is not in"):
        read_run_tables(tmp_path / "runs.csv", tmp_path / "m.csv")
    (tmp_path / "m.csv").write_text("experiment,metric,measured_ms\na,ttft_mean,fast\n")
    with pytest.raises(ValueError, match="'fast' is not a number of milliseconds"):
        read_run_tables(tmp_path / "runs.csv", tmp_path / "m.csv")
    (tmp_path / "m.csv").write_text("experiment,metric\na,ttft_mean\n")
    with pytest.raises(ValueError, match="missing column 'measured_ms'"):
        read_run_tables(tmp_path / "runs.csv", tmp_path / "m.csv")


VLLM_SCRAPE = """# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m \\"q\\""} {b1}
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.5",model_name="m \\"q\\""} {b2}
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m \\"q\\""} {n}
vllm:time_to_first_token_seconds_count{engine="0",model_name="m \\"q\\""} {n}
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m \\"q\\""} {s}
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m \\"q\\""} {g}
"""


def _scrape(b1, b2, n, s, g):
    return VLLM_SCRAPE.replace("{b1}", str(b1)).replace("{b2}", str(b2)).replace(
        "{n}", str(n)).replace("{s}", str(s)).replace("{g}", str(g))


def test_prometheus_text_before_and_after():
    before = prom.parse(_scrape(1, 2, 2, 0.3, 100), "before")
    after = prom.parse(_scrape(5, 9, 12, 2.8, 1100), "after")
    assert dict(before[0][1])["model_name"] == 'm "q"'
    m = prom.run_metrics(after, before)
    assert m["ttft_mean"] == pytest.approx(2.5 / 10)
    assert m["num_generated_tokens"] == 1000
    # PromQL's histogram_quantile: rank 5 of 10 falls in (0.1, 0.5] holding ranks 4..7
    assert m["ttft_p50"] == pytest.approx(0.1 + 0.4 * (5 - 4) / (7 - 4))
    assert m["ttft_p99"] == 0.5       # the +Inf bucket: its lower bound
    with pytest.raises(ValueError, match="restarted"):
        prom.run_metrics(before, after)


def test_prometheus_text_errors_name_the_line():
    with pytest.raises(ValueError, match="scrape, line 2: not a Prometheus sample"):
        prom.parse("# TYPE x gauge\nx{a=\"1\" 3\n", "scrape")
    with pytest.raises(ValueError, match="line 1: 'abc' is not a number"):
        prom.parse("x 1\n".replace("1", "abc"), "s")


def test_openmetrics_of_a_run_reads_back_as_its_metrics(run):
    series = prom.scrapes(prom.parse(openmetrics_text(run, interval=1.0), "om"))
    assert len(series) >= 2
    m = prom.run_metrics(series[-1])
    s = run.summary()
    assert m["ttft_mean"] == pytest.approx(s["ttft_mean"], rel=1e-9)
    assert m["e2el_mean"] == pytest.approx(s["e2el_mean"], rel=1e-9)
    assert m["itl_mean"] == pytest.approx(s["itl_mean"], rel=1e-9)
    assert m["num_generated_tokens"] == run.requests["num_generated_tokens"].sum()
    # the quantile the histogram gives brackets the exact p99 by one bucket
    edges = np.array([0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5])
    k = np.searchsorted(edges, s["ttft_p99"])
    assert edges[k - 1] <= m["ttft_p99"] <= edges[k]
