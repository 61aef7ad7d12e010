"""Where a sharded run's shards run: worker processes on this machine (the last shard in the
coordinator's own process), Ray actors, or (tests) all in this process.

:func:`shard_opener` gives :class:`~simsched.cluster.shards.ShardedCluster` the function that
starts one :class:`~simsched.cluster.shard.Shard` per group of replicas and returns handles with
one interface: ``advance(at)`` runs the coming window up to its first arrival, ``send(until,
batch, last)`` starts a window (both return at once where the shard runs elsewhere, so every
shard runs at the same time), ``receive()`` waits for the window's load figures, ``finish()``
collects the shard's records, ``close()`` stops it.
"""

from __future__ import annotations

import multiprocessing
import sys
from pathlib import Path
import traceback
from types import SimpleNamespace

import numpy as np

from simsched.analysis.ray_connect import connect
from simsched.analysis.spin_pipe import start_worker, use_spin
from simsched.analysis.stream import StreamingRequests
from simsched.cluster.cluster import _long_lived_requests
from simsched.cluster.shard import Shard
from simsched.engine.log import IterationLog

__all__ = ["SHARD_WORKERS", "ShardError", "ShardStream", "shard_opener"]

SHARD_WORKERS = ("process", "ray", "inline")


class ShardError(RuntimeError):
    """A shard's worker failed (its traceback is the message)."""


class InlineShard:
    """A shard in this process (windows run one shard after another: for tests; ``ahead``:
    runs each head start when told, as a worker does, else leaves it to the window)."""

    def __init__(self, args: tuple, ahead: bool = True) -> None:
        self.shard = make_shard(*args)
        self._reply = None
        self.ahead = ahead

    def advance(self, at: float) -> None:
        if self.ahead:
            self.shard.advance(at)

    def send(self, until, batch, last: bool = False) -> None:
        self._reply = self.shard.window(until, batch, last)

    def receive(self):
        return self._reply

    def finish(self) -> dict:
        return self.shard.finish()

    def close(self) -> None:
        self.shard = None


class ShardStream(StreamingRequests):
    """One shard's part of a sharded run's stream (:mod:`simsched.cluster.shards`): the
    requests its replicas served, written to parts named ``part-{part_prefix}*`` beside the
    other shards'; requests come window by window (no workload columns), and the coordinator
    writes the shed and never-arrived ones."""

    def __init__(self, path: Path, prefix: bool, part_prefix: str) -> None:
        empty = np.zeros(0, dtype=np.int64)
        super().__init__(path, np.zeros(0), empty, empty, empty, None, prefix)
        self.part_prefix = part_prefix

    def finish(self) -> None:
        """After the last window: the requests in flight as they stand, then the last chunk."""
        self.done.extend(self.live.values())
        self.live.clear()
        self.flush(final=True)


class _Idle:
    """Another shard's replica, as a shard's stream sees it: nothing logged here."""

    iteration_rows = IterationLog()


class _StreamView:
    """What a shard's stream (:class:`ShardStream`) reads of its
    cluster: every replica by index (the shard's own, the others idle), each request's replica
    and the replicas' output delays (``specs``)."""

    fleet = None

    def __init__(self, shard: Shard, delays: list) -> None:
        self.replicas = [shard.replicas.get(i, _Idle) for i in range(len(delays))]
        self.replica_of = shard.replica_of
        self.specs = [SimpleNamespace(cost_model=SimpleNamespace(output_delay=d))
                      for d in delays]


def make_shard(args: tuple, stream: tuple | None) -> Shard:
    """A :class:`~simsched.cluster.shard.Shard` of ``args``; with ``stream`` (``(path, prefix,
    part prefix, every replica's output delay)``) writing its records under ``path``."""
    if stream is None:
        return Shard(*args)
    path, prefix, part_prefix, delays = stream
    store = ShardStream(path, prefix, part_prefix)
    shard = Shard(*args, store=store)
    store.bind(_StreamView(shard, delays))
    return shard


def _serve(conn, args: tuple) -> None:
    """A worker process: build the shard, then answer windows until told to finish."""
    try:
        with _long_lived_requests():
            shard = make_shard(*args)
            while True:
                message = conn.recv()
                if message == "stop":
                    return
                if message is None:
                    conn.send(("ok", shard.finish()))
                    return
                if type(message) is float:      # a head start on the coming window: no reply
                    shard.advance(message)
                    continue
                conn.send(("ok", shard.window(*message)))
    except BaseException:       # every failure goes back to the coordinator, which raises it
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


class ProcessShard:
    """A shard in a worker process of its own, talking over a pipe (forked where the platform
    allows, so the replicas' specs are not pickled); with ``spin``, a polled one
    (:mod:`simsched.analysis.spin_pipe`: no process sleeps between windows)."""

    def __init__(self, args: tuple, spin: bool = False) -> None:
        if spin:            # (use_spin: Linux only, where workers are forked anyway)
            self.process, self.conn = start_worker(_serve, (args,))
            return
        method = "fork" if sys.platform.startswith("linux") else "spawn"
        ctx = multiprocessing.get_context(method)
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child, args), daemon=True)
        self.process.start()
        child.close()

    def advance(self, at: float) -> None:
        self.conn.send(float(at))

    def send(self, until, batch, last: bool = False) -> None:
        self.conn.send((until, batch, last))

    def receive(self):
        try:
            status, value = self.conn.recv()
        except EOFError:
            raise ShardError(f"a shard's worker process ended (exit code "
                             f"{self.process.exitcode})") from None
        if status == "error":
            raise ShardError(f"a shard failed:\n{value}")
        return value

    def finish(self) -> dict:
        self.conn.send(None)
        return self.receive()

    def close(self) -> None:
        # Told, not left to see the pipe close: workers forked later hold copies of its end.
        if self.process.is_alive():
            try:
                self.conn.send("stop")
            except OSError:
                pass                # it has ended (and closed its end) meanwhile
        self.conn.close()
        self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join()


class RayShard:
    """A shard as a Ray actor (``actor`` made by :func:`_actor_class`)."""

    def __init__(self, ray, actor_class, args: tuple, num_cpus: float) -> None:
        self.ray = ray
        self.actor = actor_class.options(num_cpus=num_cpus).remote(args)
        self._ref = None

    def advance(self, at: float) -> None:
        self.actor.advance.remote(at)           # (an actor runs its calls in order)

    def send(self, until, batch, last: bool = False) -> None:
        self._ref = self.actor.window.remote(until, batch, last)

    def receive(self):
        return self.ray.get(self._ref)

    def finish(self) -> dict:
        return self.ray.get(self.actor.finish.remote())

    def close(self) -> None:
        self.ray.kill(self.actor)


class _ShardActor:
    """The body of a shard's Ray actor."""

    def __init__(self, args: tuple) -> None:
        self.shard = make_shard(*args)

    def advance(self, at: float) -> None:
        self.shard.advance(at)

    def window(self, until, batch, last: bool = False):
        return self.shard.window(until, batch, last)

    def finish(self) -> dict:
        return self.shard.finish()


def shard_opener(config, specs: list, num_requests: int, workers: str = "process",
                 ray_address: str | None = None, stream_to=None, prefix: bool = False):
    """The ``open_shards(groups, reads_kv, output_tokens)`` of a sharded run of ``config``
    (``specs``: every replica's spec; ``workers``: one of :data:`SHARD_WORKERS`;
    ``ray_address``: the Ray cluster to use, None: the one initialised here or a local one;
    ``stream_to``: each shard streams its records there, ``prefix`` as the run's stream)."""
    if workers not in SHARD_WORKERS:
        raise ValueError(f"shard_workers must be one of {list(SHARD_WORKERS)}, got {workers!r}")
    if ray_address is not None and workers != "ray":
        raise ValueError("ray_address is for shard_workers='ray'")
    ray = connect(ray_address, "shard_workers='ray'") if workers == "ray" else None

    def open_shards(groups, reads_kv: bool, output_tokens) -> list:
        handles = []
        # Polled channels where every process (the coordinator runs the last shard) has a CPU.
        spin = workers == "process" and use_spin(len(groups))
        try:
            delays = [float(getattr(s.cost_model, "output_delay", 0.0)) for s in specs]
            for k, group in enumerate(groups):
                stream = None if stream_to is None else (stream_to, prefix, f"s{k:03d}-", delays)
                args = ((config, group, {i: specs[i] for i in group}, num_requests, reads_kv,
                         output_tokens), stream)
                # The coordinator runs the last shard itself, after sending every other its
                # window: one process fewer to wake per window, and its core does shard work
                # instead of waiting. It routes before running that shard's head start, so the
                # workers get their windows sooner: the head start is part of its window.
                if workers == "inline":
                    handles.append(InlineShard(args))
                elif workers == "process" and k == len(groups) - 1:
                    handles.append(InlineShard(args, ahead=False))
                elif workers == "process":
                    handles.append(ProcessShard(args, spin))
                else:
                    # At most one CPU each, so that a small cluster still places every shard.
                    cpus = min(1.0, float(ray.cluster_resources().get("CPU", 1)) / len(groups))
                    handles.append(RayShard(ray, ray.remote(_ShardActor), args, cpus))
        except BaseException:
            for handle in handles:
                handle.close()
            raise
        return handles

    return open_shards
