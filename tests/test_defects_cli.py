"""Issue 24, section 3: the CLI, capacity, plan and config defects a new user hits.

Item numbers are the issue's (3.1, 3.2, 3.3, 3.9, 3.10, 3.11, 3.15).
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import simsched
from simsched import SimConfig
from simsched.analysis.capacity import MAX_OVERLOAD, capacity_search, t_quantile_975
from simsched.analysis.plan import Candidate, plan
from simsched.analysis.runner import RejectionWarning
from simsched.cli import main
from simsched.workloads.workload import WORKLOADS, WorkloadConfig

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


# ------------------------------------------------------------------ 1: a target that never fails
def test_capacity_with_a_loose_target_stops_at_the_overload_bound(tmp_path, capsys):
    # The command: 500 requests never queue long enough to break TTFT p99 <= 5 s.
    out = tmp_path / "cap"
    assert main(["capacity", "--target", "ttft_p99=5", "--num-requests", "500",
                 "--executor", "serial", "--quiet", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    row = pd.read_csv(out / "capacity.csv").iloc[0]
    assert row["status"] == "never_violated"
    peak = row["max_request_throughput"]
    # the largest rate tried is the first doubling at or past MAX_OVERLOAD x the peak
    assert MAX_OVERLOAD * peak <= row["capacity"] < 2 * MAX_OVERLOAD * peak
    assert math.isinf(row["ci_high"]) and math.isinf(row["bracket_high"])
    runs = pd.read_csv(out / "runs.csv")
    assert runs["holds"].all() and runs["rate"].max() == row["capacity"]
    assert "never_violated" in err and "does not bind" in err and err.count("\n") == 1
    assert f"stops at {MAX_OVERLOAD:g}× the highest" in " ".join(
        (ROOT / "docs" / "api.md").read_text().split())


def test_capacity_with_high_keeps_at_high():
    cfg = SimConfig().replace(num_requests=60)
    row = capacity_search(cfg, {"ttft_p99": 5.0}, low=1.0, high=3.0, executor="serial",
                          progress=False).iloc[0]
    assert row["status"] == "at_high" and row["capacity"] == 3.0


# ------------------------------------------------------------------ 2: several seeds
def test_capacity_over_seeds_is_the_mean_with_an_interval_around_it(tmp_path):
    # The command: per-seed capacities 3.875 and 5.5 gave capacity 4, CI -5.6..15.
    out = tmp_path / "cap"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["capacity", "--workload", "sharegpt", "--num-requests", "200",
                     "--target", "ttft_p99=2", "--target", "tpot_p99=0.15",
                     "--policies", "fcfs,spf", "--seeds", "0,1", "--executor", "serial",
                     "--quiet", "--out", str(out)]) == 0
    table = pd.read_csv(out / "capacity.csv").set_index("policy")
    seeds = pd.read_csv(out / "seed_capacities.csv")
    for policy, rows in seeds.groupby("policy"):
        caps = rows["capacity"].to_numpy()
        assert caps.min() < caps.max()                     # the seeds disagree
        row = table.loc[policy]
        assert row["capacity"] == pytest.approx(caps.mean())
        half = t_quantile_975(len(caps) - 1) * caps.std(ddof=1) / math.sqrt(len(caps))
        assert row["ci_high"] == pytest.approx(caps.mean() + half)
        assert row["ci_low"] == pytest.approx(max(0.0, caps.mean() - half))
        assert 0 <= row["ci_low"] <= row["capacity"] <= row["ci_high"]
        assert row["bracket_low"] == caps.min()
        assert (rows["status"] == "ok").all() and row["status"] == "ok"


# ------------------------------------------------------------------ 3: plans that drop requests
def test_plan_refuses_a_candidate_that_rejects_requests_with_one_warning():
    # A 256-token context cannot serve the lesson workload's longer requests: no replica count
    # helps, so the candidate is 'rejects' at every rate after a single probe.
    workload = WorkloadConfig(name="lesson", num_requests=100, rate=5.0)
    base = SimConfig().replace(max_model_len=256)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = plan(workload, {"ttft_p99": 1.0}, [Candidate("a100-80gb"), Candidate("l40s")],
                      rates=[5.0, 10.0], base_config=base, executor="serial")
    table = result.table
    assert (table["status"] == "rejects").all()
    assert table["cost_per_million"].isna().all() and not table["pareto"].any()
    first = table[table["rate"] == 5.0]
    assert (first["num_rejected"] > 0).all()
    assert len(result.runs) == 2                         # one probe per candidate
    assert not any(issubclass(w.category, RejectionWarning) for w in caught)
    mine = [str(w.message) for w in caught if "plan:" in str(w.message)]
    assert len(mine) == 1 and "max_model_len 256" in mine[0]
    assert "'a100-80gb tp1 jsq'" in mine[0] and "'l40s tp1 jsq'" in mine[0]
    with pytest.raises(ValueError, match="no candidate meets"):
        result.best(5.0)


def test_plan_adds_replicas_until_nothing_is_shed():
    # One waiting request per replica: fewer replicas shed most requests while the admitted
    # ones stay fast. The plan must not count that as meeting the target.
    workload = WorkloadConfig(name="lesson", num_requests=300, rate=10.0)
    cand = Candidate("a100-80gb", max_replicas=16,
                     settings={"max_num_queued_per_replica": 1, "max_num_seqs": 4})
    result = plan(workload, {"ttft_p99": 5.0}, [cand], rates=[40.0], executor="serial")
    row = result.table.iloc[0]
    assert row["status"] == "ok" and row["num_rejected"] == 0
    runs = result.runs
    assert (runs.loc[runs["num_shed"] > 0, "holds"] == False).all()      # noqa: E712
    assert (runs["num_shed"] > 0).any()
    rerun = simsched.simulate(result.config(row["label"], 40.0))
    assert rerun.summary()["num_rejected"] == 0


def test_plan_table_has_metric_columns_even_when_nothing_is_feasible():
    workload = WorkloadConfig(name="lesson", num_requests=50, rate=5.0)
    result = plan(workload, {"ttft_p99": 1e-6}, [Candidate("a100-80gb", max_replicas=1)],
                  executor="serial")
    assert result.table.loc[0, "status"] == "infeasible"
    assert math.isnan(result.table.loc[0, "ttft_p99"]) and result.table.loc[0, "num_rejected"] == 0


def _readme_plan_example() -> str:
    text = (ROOT / "docs" / "api.md").read_text()
    block = text[text.index("plan = simsched.plan("):]
    return block[:block.index("plan.table")]


def test_readme_plan_example_serves_every_request():
    from simsched.cost import hardware
    from simsched.workloads.workload import generate

    assert 'model="mistral-7b"' in _readme_plan_example()    # a context for the whole trace
    table = generate(WorkloadConfig.preset("azure-conv"), np.random.default_rng(0))
    longest = (table["num_prompt_tokens"] + table["num_output_tokens"]).max()
    mistral = SimConfig().replace(model="mistral-7b").hardware
    assert longest <= hardware.max_model_len(mistral) == 32768
    # what the README says of the default model
    assert longest > hardware.max_model_len(SimConfig().hardware) == 4096
    assert "Llama-2-7B's 4,096-token context" in " ".join(
        (ROOT / "docs" / "api.md").read_text().split())


@pytest.mark.slow
def test_readme_plan_example_runs_without_rejections():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scope = {"simsched": simsched, "SimConfig": SimConfig}
        exec(_readme_plan_example(), scope)
    table = scope["plan"].table
    assert (table["status"] == "ok").all() and (table["num_rejected"] == 0).all()
    assert not [w for w in caught if "reject" in str(w.message)]


# ------------------------------------------------------------------ 9: --set tuples, examples
@pytest.mark.parametrize("item, field, expected", [
    ("prompt_range=[10,100]", "workload.prompt_range", (10, 100)),
    ("workload.output_range=[5, 50]", "workload.output_range", (5, 50)),
    ("tenant_weights=[3,1]", "workload.tenant_weights", (3.0, 1.0)),
    ("rate_schedule=[[60,2],[60,8]]", "workload.rate_schedule", ((60.0, 2.0), (60.0, 8.0))),
    ("think_time=[\"exponential\",5]", "workload.think_time", ("exponential", 5.0)),
    ("think_time=2.5", "workload.think_time", ("fixed", 2.5)),
    ('replicas=[{"gpu":"h100-sxm","count":2}]', "cluster.replicas",
     ({"gpu": "h100-sxm", "count": 2},)),
    ('roles=["prefill","decode","mixed"]', "cluster.roles", ("prefill", "decode", "mixed")),
    ('policy_options={"aging_rate":2}', "scheduler.policy_options", {"aging_rate": 2}),
])
def test_set_accepts_tuple_and_mapping_fields_as_json(item, field, expected):
    from simsched.cli import make_parser
    from simsched.cli.configs import config_from_args

    argv = ["run", "--set", item, "--set", "num_replicas=3", "--set", "num_tenants=2",
            "--policy", "spf"]
    if "rate_schedule" in item:
        argv += ["--set", "arrival=piecewise"]
    if "think_time" in item:
        argv += ["--workload", "sessions"]
    config, _ = config_from_args(make_parser().parse_args(argv))
    section, name = field.split(".")
    assert getattr(getattr(config, section), name) == expected


@pytest.mark.parametrize("item, words", [
    ("prompt_range=10,100", ["prompt_range takes a list", "--set prompt_range=[10,100]"]),
    ("tenant_weights=3", ["tenant_weights takes a list", "--set tenant_weights=[3,1]"]),
    ("roles=prefill", ["roles takes a list", '--set roles=["prefill","decode"]']),
    ("replicas=[{gpu:1}]", ["not valid JSON", "--set replicas=[{\"gpu\""]),
    ("policy_options=aging", ["policy_options takes a mapping", "--set policy_options={"]),
])
def test_set_on_a_tuple_field_says_how(item, words, capsys):
    assert main(["run", "--set", item, "--out", "/nonexistent/never"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("simsched: error: --set ") and "\n" not in err
    for word in words:
        assert word in err, err


def test_vary_takes_json_values_with_commas(tmp_path):
    out = tmp_path / "sweep"
    assert main(["sweep", "--num-requests", "20", "--set", "lengths=uniform",
                 "--vary", "prompt_range=[10,100],[200,400]", "--executor", "serial",
                 "--quiet", "--out", str(out)]) == 0
    requests = pd.read_csv(out / "requests.csv")
    top = requests.groupby("run_id")["num_prompt_tokens"].agg(["min", "max"])
    assert top.loc[0, "max"] <= 100 and top.loc[1, "min"] >= 200


def _small(path: Path, tmp_path: Path, num_requests: int) -> Path:
    text = re.sub(r"(?m)^num_requests = \d+", f"num_requests = {num_requests}", path.read_text())
    small = tmp_path / path.name
    small.write_text(text)
    return small


@pytest.mark.parametrize("name", ["run", "cluster", "disaggregated"])
def test_example_configs_run(name, tmp_path, capsys):
    out = tmp_path / name
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["run", str(EXAMPLES / f"{name}.toml"), "--num-requests", "60",
                     "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    requests = pd.read_csv(out / "requests.csv")
    assert len(requests) == 60 and (requests["status"] == "finished").all()
    config = SimConfig.from_json(out / "config.json")
    if name == "cluster":
        assert set(requests["replica"]) == {0, 1, 2, 3}
        assert [c.hardware.gpu for c in config.replica_configs()] == \
            ["h100-sxm", "h100-sxm", "a100-80gb", "a100-80gb"]
    if name == "disaggregated":
        assert config.cluster.disaggregated and "num_kv_transfers" in printed


def test_example_plan_runs(tmp_path, capsys):
    out = tmp_path / "plan"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["plan", str(_small(EXAMPLES / "plan.toml", tmp_path, 150)),
                     "--executor", "serial", "--quiet", "--out", str(out)]) == 0
    table = pd.read_csv(out / "plan.csv")
    assert len(table) == 6 and set(table["rate"]) == {5.0, 10.0}
    assert "a100 budget 512" in set(table["label"]) and (table["status"] == "ok").any()


def test_readme_points_to_every_example():
    readme = (ROOT / "README.md").read_text()
    files = sorted(p.name for p in EXAMPLES.glob("*.toml"))
    assert len(files) >= 4
    for name in files:
        assert f"examples/{name}" in readme, name


# ------------------------------------------------------------------ 10: version, help, summary
def test_version():
    proc = subprocess.run([sys.executable, "-m", "simsched", "--version"], capture_output=True,
                          text=True, cwd=ROOT)
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"simsched {simsched.__version__}"


def test_help_lists_every_workload_and_config_section():
    proc = subprocess.run([sys.executable, "-m", "simsched", "run", "--help"],
                          capture_output=True, text=True, cwd=ROOT)
    text = " ".join(proc.stdout.split())
    for name in WORKLOADS:
        assert name in text.replace("- ", "-"), name
    for section in ("[scheduler]", "[cache]", "[hardware]", "[workload]", "[cluster]", "[run]",
                    "[slo]"):
        assert section in text, section


def test_run_summary_shows_prefix_and_kv_transfer_figures(tmp_path, capsys):
    assert main(["run", "--workload", "shared-prefix", "--num-requests", "40",
                 "--set", "enable_prefix_caching=true", "--out", str(tmp_path / "a")]) == 0
    header = capsys.readouterr().out.splitlines()[0].split()
    assert "prefix_hit_rate" in header
    assert pd.read_csv(tmp_path / "a" / "summary.csv").loc[0, "prefix_hit_rate"] > 0.3
    assert main(["run", "--num-requests", "40", "--set", "num_replicas=2",
                 "--set", 'roles=["prefill","decode"]', "--out", str(tmp_path / "b")]) == 0
    header = capsys.readouterr().out.splitlines()[0].split()
    for name in ("num_kv_transfers", "kv_transfer_gb", "kv_transfer_time_mean"):
        assert name in header
    summary = pd.read_csv(tmp_path / "b" / "summary.csv").iloc[0]
    requests = pd.read_csv(tmp_path / "b" / "requests.csv")
    assert summary["num_kv_transfers"] == (requests["kv_transfer_bytes"] > 0).sum() > 0
    assert summary["kv_transfer_gb"] == pytest.approx(requests["kv_transfer_bytes"].sum() / 1e9)


# ------------------------------------------------------------------ 11: config.json round trip
ROUND_TRIP = [
    SimConfig(),
    SimConfig().replace(num_replicas=4, router="least_tokens", refresh_interval=0.05,
                        replicas=({"gpu": "h100-sxm", "count": 2},
                                  {"max_num_seqs": 32, "policy": "spf",
                                   "policy_options": {"aging_rate": 3.0}}),
                        max_num_queued_per_replica=8, rate_limit=50.0, burst=10.0,
                        policy="fair", policy_options={"tenant_weights": {"t0": 2.0, "t1": 1}},
                        num_tenants=2, tenant_weights=(3, 1), lengths="uniform",
                        prompt_range=(10, 100), output_range=(4, 40), max_sim_time=100.0,
                        seed=5, check_invariants=True),
    SimConfig().replace(num_replicas=3, roles=("prefill", "decode", "mixed"), link="ib400",
                        link_latency=1e-5, decode_router="least_kv", arrival="piecewise",
                        rate_schedule=((10, 1), (5, 4)), num_priorities=3,
                        priority_weights=(1, 2, 3), preemption=True, preemption_mode="swap",
                        num_blocks=512, watermark=0.02),
    SimConfig(workload=WorkloadConfig(name="sessions", num_turns=("uniform", 2, 5),
                                      think_time=2.0, num_requests=10)).replace(
        enable_prefix_caching=True, model="llama-3-8b", gpu="h100-sxm", max_model_len=4096),
    SimConfig().replace(model="tiny", model_spec={
        "num_layers": 4, "hidden_size": 512, "num_heads": 8, "num_kv_heads": 8,
        "intermediate_size": 1024, "vocab_size": 1000, "max_context": 2048}),
]


@pytest.mark.parametrize("config", ROUND_TRIP)
def test_config_round_trips_through_json(config):
    assert SimConfig.from_json(config.to_json()) == config
    assert SimConfig.from_dict(config.to_dict()) == config
    assert SimConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


def test_a_runs_config_json_reloads_and_reruns_identically(tmp_path, capsys):
    config = ROUND_TRIP[1].replace(num_requests=40, rate=20.0, check_invariants=False)
    res = simsched.simulate(config)
    res.to_csv(tmp_path / "api")
    assert SimConfig.from_json(tmp_path / "api" / "config.json") == config
    assert SimConfig.from_json(str(tmp_path / "api" / "config.json")) == config
    # the command line: run, then run its config.json again
    assert main(["run", "--num-requests", "30", "--set", "num_replicas=2",
                 "--set", 'replicas=[{"gpu":"h100-sxm"}]', "--policy", "spf",
                 "--out", str(tmp_path / "a")]) == 0
    assert main(["run", str(tmp_path / "a" / "config.json"), "--out", str(tmp_path / "b")]) == 0
    assert capsys.readouterr().err == ""
    first = pd.read_csv(tmp_path / "a" / "requests.csv")
    again = pd.read_csv(tmp_path / "b" / "requests.csv")
    pd.testing.assert_frame_equal(first, again)
    # flags still win over the file
    assert main(["run", str(tmp_path / "a" / "config.json"), "--seed", "7",
                 "--out", str(tmp_path / "c")]) == 0
    assert json.loads((tmp_path / "c" / "config.json").read_text())["seed"] == 7


def test_a_stale_derived_block_warns(tmp_path, capsys):
    assert main(["run", "--num-requests", "20", "--out", str(tmp_path / "a")]) == 0
    path = tmp_path / "a" / "config.json"
    data = json.loads(path.read_text())
    data["derived"]["num_blocks"] += 1
    path.write_text(json.dumps(data))
    assert main(["run", str(path), "--out", str(tmp_path / "b")]) == 0
    err = capsys.readouterr().err
    assert "derived num_blocks" in err and err.count("simsched: warning") == 1


@pytest.mark.parametrize("data, words", [
    ({"cache": {"num_blockz": 4}}, ["num_blockz", "'cache'"]),
    ({"schedular": {}}, ["schedular"]),
    ({"runs": [], "factors": {}}, ["sweep"]),
    ({"cache": [1]}, ["section 'cache'"]),
    ({"cache": {"num_blocks": -1}}, ["cache.num_blocks"]),
])
def test_bad_config_json_names_the_problem(data, words, tmp_path, capsys):
    with pytest.raises(ValueError) as exc:
        SimConfig.from_dict(data)
    for word in words:
        assert word in str(exc.value)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"simsched: error: config file {path}") and err.count("\n") == 1


def test_malformed_json_file_is_one_line(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text("{not json")
    assert main(["run", str(path)]) == 2
    assert "not valid JSON" in capsys.readouterr().err


# ------------------------------------------------------------------ 15: experiments' config.json
def test_memory_pressure_and_load_sweep_write_config_json(tmp_path, monkeypatch):
    from experiments import load_sweep, memory_pressure

    memory_pressure.main(["--quick", "--quiet", "--out", str(tmp_path / "mp")])
    data = json.loads((tmp_path / "mp" / "config.json").read_text())
    runs = pd.read_csv(tmp_path / "mp" / "runs.csv")
    assert len(data["runs"]) == len(runs)
    for entry in data["runs"]:
        row = runs[runs["run_id"] == entry["run_id"]].iloc[0]
        config = SimConfig.from_dict(entry["config"])
        assert entry["variant"] == row["variant"]
        assert config.cache.num_blocks == row["cache.num_blocks"]
        assert config.scheduler.policy == memory_pressure.VARIANTS[row["variant"]]["policy"]
    monkeypatch.setattr(load_sweep, "settings", lambda quick: {
        "rates": [2.0], "seeds": [0], "num_requests": 30, "tol": 0.5})
    load_sweep.main(["--quiet", "--out", str(tmp_path / "ls")])
    data = json.loads((tmp_path / "ls" / "config.json").read_text())
    assert len(data["runs"]) == len(load_sweep.VARIANTS)
    assert {e["variant"] for e in data["runs"]} == set(load_sweep.VARIANTS)
    assert data["capacity"]["target"]["limits"] == {"ttft_p99": 2.0, "tpot_p99": 0.15}
    base = SimConfig.from_dict(data["capacity"]["base"])
    assert base == load_sweep.base_config(30)
