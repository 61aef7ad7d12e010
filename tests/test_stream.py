"""Streaming a run to Parquet: the streamed frames equal the in-memory frames of the same run."""

import dataclasses

import pandas as pd
import pytest

from simsched import SimConfig, simulate
from simsched.analysis import stream
from simsched.config.autoscaling import AutoscalingConfig
from simsched.config.cluster import ClusterConfig
from simsched.workloads.workload import WorkloadConfig

WORKLOAD = WorkloadConfig(name="custom", lengths="uniform", prompt_range=(64, 1024),
                          output_range=(16, 256), rate=40.0, duration=30.0, num_tenants=3,
                          num_priorities=2)


def both(cfg, tmp_path, monkeypatch, chunk=97):
    monkeypatch.setattr(stream, "CHUNK", chunk)      # many chunks, pruning in between
    memory = simulate(cfg)
    run = simulate(cfg, stream_to=tmp_path / "run")
    return memory, run, stream.read_stream(tmp_path / "run")


def assert_same(memory, frames):
    pd.testing.assert_frame_equal(frames["requests"], memory.requests)
    pd.testing.assert_frame_equal(frames["iterations"], memory.iterations)
    if len(memory.preemptions):
        pd.testing.assert_frame_equal(frames["preemptions"], memory.preemptions)
    else:
        assert frames["preemptions"].empty


@pytest.mark.parametrize("changes", [
    dict(num_replicas=1),
    dict(num_replicas=4, router="least_tokens"),
    # KV-starved: recompute preemptions, their causes and the gaps after a re-prefill.
    dict(num_replicas=2, router="jsq", num_blocks=400),
    # Cut short: requests in flight and never arrived are recorded as they stand.
    dict(num_replicas=2, max_sim_time=12.0),
])
def test_streamed_frames_equal_in_memory_frames(tmp_path, monkeypatch, changes):
    cfg = SimConfig(workload=WORKLOAD).replace(**changes)
    memory, run, frames = both(cfg, tmp_path, monkeypatch)
    assert_same(memory, frames)
    assert len(list((tmp_path / "run" / "requests").glob("*.parquet"))) >= 2
    if "num_blocks" in changes:
        assert len(memory.preemptions) > 0
    # The per-window sums agree with the frame.
    windows = run.windows
    assert windows["num_requests"].sum() == len(memory.requests)
    done = memory.requests[memory.requests["status"] == "finished"]
    assert windows["num_finished"].sum() == len(done)
    assert (windows["ttft_mean"] * windows["num_finished"]).sum() == pytest.approx(
        done["ttft"].sum(), rel=1e-9) or "max_sim_time" in changes


def test_streamed_run_without_tenants_or_priorities_equals_in_memory(tmp_path, monkeypatch):
    # The streamed store keeps such a workload compactly (int16 lengths, int8 priorities, no
    # tenant list); cut short, requests never arrived are built from those columns.
    plain = dataclasses.replace(WORKLOAD, num_tenants=1, num_priorities=1)
    cfg = SimConfig(workload=plain).replace(num_replicas=2, max_sim_time=12.0)
    memory, run, frames = both(cfg, tmp_path, monkeypatch)
    assert_same(memory, frames)
    assert (memory.requests["status"] == "pending").any()
    assert memory.requests["tenant"].isna().all()


def test_streamed_autoscaled_run_equals_in_memory(tmp_path, monkeypatch):
    auto = AutoscalingConfig(policy="scheduled", plan=((0.0, 1), (8.0, 3), (20.0, 1)),
                             provisioning_time=1.0, model_load_time=1.0, price_per_hour=3.0)
    cfg = dataclasses.replace(SimConfig(workload=WORKLOAD), cluster=ClusterConfig(
        num_replicas=1, router="jsq", autoscaling=auto))
    memory, run, frames = both(cfg, tmp_path, monkeypatch)
    assert_same(memory, frames)
    pd.testing.assert_frame_equal(frames["fleet_units"], memory.fleet.units)
    assert run.info["fleet_cost"] == memory.fleet.cost
    assert run.dataset("requests").count_rows() == len(memory.requests)


@pytest.mark.parametrize("on_remove", ["migrate", "abort"])
def test_streamed_run_whose_removed_replica_migrates_or_aborts_equals_in_memory(
        tmp_path, monkeypatch, on_remove):
    # A busy replica removed at t=20: its requests move (num_migrations column) or end aborted.
    auto = AutoscalingConfig(policy="scheduled", plan=((0.0, 3), (20.0, 2)),
                             provisioning_time=0.0, model_load_time=0.0, interval=5.0,
                             price_per_hour=3.0, on_remove=on_remove, migration_time=0.5)
    cfg = dataclasses.replace(SimConfig(workload=WORKLOAD), cluster=ClusterConfig(
        num_replicas=3, router="jsq", autoscaling=auto)).replace(max_num_seqs=4)
    memory, run, frames = both(cfg, tmp_path, monkeypatch)
    assert_same(memory, frames)
    if on_remove == "migrate":
        assert memory.requests["num_migrations"].sum() == run.info["num_migrations"] > 0
    else:
        assert (memory.requests["status"] == "aborted").sum() == run.info["num_aborted"] > 0


def test_stream_rejects_what_it_cannot_stream(tmp_path):
    cfg = SimConfig(workload=WorkloadConfig(name="shared-prefix", system_prompt_len=64,
                                            num_requests=20))
    with pytest.raises(ValueError, match="stream_to supports plain workloads"):
        simulate(cfg, stream_to=tmp_path / "x")
    adapters = pd.DataFrame({"arrival_at": [0.0, 0.1], "num_prompt_tokens": [10, 20],
                             "num_output_tokens": [5, 5], "adapter": [0, 1]})
    lora = SimConfig().replace(**{"scheduler.lora": {"max_loras": 2}})
    with pytest.raises(ValueError, match="no LoRA adapters"):
        simulate(lora, requests=adapters, stream_to=tmp_path / "y")
    with pytest.raises(ValueError, match="not a streamed run"):
        stream.read_stream(tmp_path / "nothing")


def test_stream_without_pyarrow_says_what_to_install_before_running(tmp_path, monkeypatch):
    import builtins
    real_import = builtins.__import__

    def no_pyarrow(name, *args, **kwargs):
        if name == "pyarrow" or name.startswith("pyarrow."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    cfg = SimConfig(workload=WORKLOAD)
    with pytest.raises(ImportError, match=r"needs pyarrow: pip install 'simsched\[parquet\]'"):
        simulate(cfg, stream_to=tmp_path / "run")
    assert not (tmp_path / "run").exists()          # nothing started


def test_stream_writes_parts_on_the_run_thread(tmp_path, monkeypatch):
    # pandas' to_parquet has pyarrow convert a large frame's columns on a thread pool; a
    # streamed run writes its parts on its own thread, keeping frames and attrs as pandas does.
    import concurrent.futures
    submitted = []
    real_submit = concurrent.futures.ThreadPoolExecutor.submit

    def submit(self, *args, **kwargs):
        submitted.append(args[0])
        return real_submit(self, *args, **kwargs)

    monkeypatch.setattr(concurrent.futures.ThreadPoolExecutor, "submit", submit)
    frame = pd.DataFrame({f"c{i}": [0.5 * k for k in range(5000)] for i in range(8)})
    frame.attrs["unit"] = "s"
    stream._write_parquet(frame, tmp_path / "f.parquet")
    assert not submitted
    back = pd.read_parquet(tmp_path / "f.parquet")
    pd.testing.assert_frame_equal(back, frame)
    assert back.attrs == {"unit": "s"}
    import pyarrow as pa
    cpus = pa.cpu_count()
    pa.set_cpu_count(max(cpus, 2))          # pyarrow pools only where it sees several CPUs
    try:
        frame.to_parquet(tmp_path / "g.parquet")      # pandas' own way does use the pool
    finally:
        pa.set_cpu_count(cpus)
    assert submitted
    assert (tmp_path / "f.parquet").read_bytes() == (tmp_path / "g.parquet").read_bytes()


def test_cli_run_stream_writes_parquet(tmp_path, capsys):
    from simsched.cli import main
    assert main(["run", "--workload", "lesson", "--num-requests", "200", "--stream",
                 "--out", str(tmp_path)]) == 0
    frames = stream.read_stream(tmp_path / "stream")
    assert len(frames["requests"]) == 200 and (frames["requests"]["status"] == "finished").all()
    assert "num_finished" in capsys.readouterr().out


def test_iteration_logs_drain_between_request_chunks(tmp_path, monkeypatch):
    # Small drains of the iteration logs between (few) request chunks change nothing.
    monkeypatch.setattr(stream, "ITERATION_BYTES", 2000)
    cfg = SimConfig(workload=dataclasses.replace(WORKLOAD, duration=60.0)).replace(num_replicas=3)
    memory, run, frames = both(cfg, tmp_path, monkeypatch, chunk=1500)
    assert_same(memory, frames)
    parts = list((tmp_path / "run" / "iterations").glob("*.parquet"))
    assert len(parts) > len(list((tmp_path / "run" / "requests").glob("*.parquet")))


def test_only_step_ends_in_flight_requests_need_are_kept(tmp_path, monkeypatch):
    kept = []
    prune = stream.StreamingRequests._prune

    def spy(self):
        prune(self)
        kept.append(sum(len(steps) for steps in self.steps))

    monkeypatch.setattr(stream.StreamingRequests, "_prune", spy)
    cfg = SimConfig(workload=dataclasses.replace(WORKLOAD, duration=90.0)).replace(
        num_replicas=2)
    memory, run, frames = both(cfg, tmp_path, monkeypatch, chunk=200)
    assert_same(memory, frames)
    decodes = int((memory.iterations["num_decode_tokens"] > 0).sum())
    assert len(kept) > 10 and max(kept) < decodes / 5
