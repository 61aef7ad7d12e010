"""The polled channel between a sharded run's coordinator and its forked workers
(simsched.analysis.spin_pipe): messages of any size arrive whole and in order, a peer that ends
is noticed instead of waited for, and sharded runs give the one-process run over either channel."""

import os
import signal
import sys
import time

import numpy as np
import pytest

import simsched
from simsched.analysis import spin_pipe
from simsched.analysis.shard_workers import ProcessShard, ShardError
from simsched.analysis.spin_pipe import start_worker, use_spin
from simsched.config import SimConfig
from tests.golden.make_golden import CASES
from tests.test_shards import assert_same_run

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forked workers: Linux")


def _echo(conn) -> None:
    """Send back every message until None."""
    while (message := conn.recv()) is not None:
        conn.send(message)


@linux
def test_messages_of_every_size_arrive_whole_and_in_order():
    worker, conn = start_worker(_echo)
    try:
        big = np.arange(3_000_000, dtype=np.int64)          # 24 MB: many pipe-fulls
        messages = [0.05, (1, [2.5, None], "x" * 70_000), {"big": big}, b"", ("last",)]
        for message in messages:        # (one at a time: an echo is a message back)
            conn.send(message)
            got = conn.recv()
            if isinstance(message, dict):
                np.testing.assert_array_equal(got["big"], big)
            else:
                assert got == message
        conn.send(None)
        worker.join()
        assert worker.exitcode == 0
    finally:
        conn.close()


@linux
def test_a_peer_that_ends_is_an_eof_not_a_hang(monkeypatch):
    monkeypatch.setattr(spin_pipe, "SPIN_TIME", 0.001)
    monkeypatch.setattr(spin_pipe, "CHECK_TIME", 0.01)
    worker, conn = start_worker(_echo)
    try:
        conn.send("ping")
        assert conn.recv() == "ping"
        os.kill(worker.pid, signal.SIGKILL)
        started = time.perf_counter()
        with pytest.raises(EOFError):
            conn.recv()
        assert time.perf_counter() - started < 5
    finally:
        conn.close()


def test_use_spin_reads_the_override(monkeypatch):
    monkeypatch.setenv("SIMSCHED_SHARD_SPIN", "0")
    assert not use_spin(1)
    monkeypatch.setenv("SIMSCHED_SHARD_SPIN", "1")
    assert use_spin(10_000) == sys.platform.startswith("linux")
    monkeypatch.setenv("SIMSCHED_SHARD_SPIN", "yes")
    if sys.platform.startswith("linux"):
        with pytest.raises(ValueError, match="SIMSCHED_SHARD_SPIN must be 0 or 1"):
            use_spin(2)
    monkeypatch.delenv("SIMSCHED_SHARD_SPIN")
    if sys.platform.startswith("linux"):
        assert use_spin(1) and not use_spin(10_000)


@linux
@pytest.mark.parametrize("spin", ["0", "1"])
def test_worker_processes_over_either_channel_give_the_one_process_run(monkeypatch, spin):
    monkeypatch.setenv("SIMSCHED_SHARD_SPIN", spin)
    cfg = SimConfig().replace(**{**CASES["lesson_spf_preempt"], **dict(
        num_replicas=3, router="least_tokens", refresh_interval=0.05, rate=90.0)})
    one = simsched.simulate(cfg)
    got = simsched.simulate(cfg, shards=3)
    assert got.info["sharding"]["num_windows"] > 10
    assert_same_run(one, got)


@linux
def test_a_killed_polled_worker_raises_in_the_coordinator(monkeypatch):
    monkeypatch.setattr(spin_pipe, "SPIN_TIME", 0.001)
    monkeypatch.setattr(spin_pipe, "CHECK_TIME", 0.01)
    shard = ProcessShard(((None,), None), spin=True)        # its Shard(None) fails at once
    try:
        with pytest.raises(ShardError, match="a shard failed"):
            shard.receive()
    finally:
        shard.close()
    shard = ProcessShard(((None,), None), spin=True)
    try:
        os.kill(shard.process.pid, signal.SIGKILL)
        with pytest.raises(ShardError, match="worker process ended"):
            shard.receive()
    finally:
        shard.close()


def test_a_polled_worker_is_refused_off_linux(monkeypatch):
    monkeypatch.setattr(spin_pipe.sys, "platform", "darwin")
    with pytest.raises(ValueError, match="forked workers \\(Linux\\)"):
        start_worker(lambda channel: None)
