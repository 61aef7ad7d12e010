"""A two-way channel to a forked worker process whose reader polls instead of sleeping.

A sharded run (:mod:`simsched.cluster.shards`) hands a window to each worker and waits for its
load figures at every synchronised snapshot refresh: 1.7 million times in a day of 50 ms
snapshots. Over a blocking pipe (``multiprocessing.Pipe``) each hand-off costs the woken
process's scheduling latency: a small message's round trip to a forked process is about 40 us on
an idle 2-core machine. Where every process of the run has a CPU of its own, neither side needs
to sleep: the reader polls a non-blocking pipe (a ``read`` that finds nothing returns at once),
and the round trip falls to about 8 us (``python -m benchmarks.shards --round-trip`` times
both).

:class:`SpinChannel` has the ``send``/``recv``/``close`` of a ``multiprocessing`` connection, so
the worker's loop is the same over either. It polls for at most :data:`SPIN_TIME` seconds, then
sleeps in ``poll`` as a blocking pipe would, checking every :data:`CHECK_TIME` seconds that
its peer is alive (a worker whose coordinator was killed ends instead of waiting forever; a
coordinator whose worker died raises ``EOFError``, as a closed pipe does). Messages are pickled,
each framed by its length, so they may be of any size. Linux only (a forked worker, where a
sharded run forks its workers; ``os.pipe`` with non-blocking reads); :func:`use_spin` says
where it is used.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import select
import struct
import sys
import time

__all__ = ["CHECK_TIME", "SPIN_TIME", "SpinChannel", "start_worker", "use_spin"]

# How long a reader polls before it sleeps: longer than almost every window of a busy fleet
# (a few hundred microseconds of shard work), short enough that an idle peer costs little CPU.
SPIN_TIME = 0.02
# While asleep, how often the reader checks that its peer is alive.
CHECK_TIME = 0.2
_HEADER = struct.Struct("<Q")
_CHUNK = 1 << 20


def use_spin(num_processes: int) -> bool:
    """Whether a run of ``num_processes`` processes (the coordinator and its workers) polls:
    on Linux (where the workers are forked) when each process has a CPU of its own (polling
    beside other work would take its CPU). ``SIMSCHED_SHARD_SPIN=1`` or ``0`` overrides the
    CPU count."""
    if not sys.platform.startswith("linux"):
        return False
    forced = os.environ.get("SIMSCHED_SHARD_SPIN", "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    if forced:
        raise ValueError(f"SIMSCHED_SHARD_SPIN must be 0 or 1, got {forced!r}")
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:          # (not on every POSIX platform)
        cpus = os.cpu_count() or 1
    return num_processes <= cpus


class SpinChannel:
    """One end of a channel: reads ``read_fd`` (made non-blocking here), writes ``write_fd``;
    ``peer_alive()`` says whether the other end can still answer."""

    def __init__(self, read_fd: int, write_fd: int, peer_alive) -> None:
        os.set_blocking(read_fd, False)
        self.read_fd, self.write_fd = read_fd, write_fd
        self.peer_alive = peer_alive
        self._buffer = bytearray()
        self._poller = None

    def send(self, obj) -> None:
        """Pickle ``obj`` and write it whole (blocking while the pipe is full)."""
        payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        view = memoryview(_HEADER.pack(len(payload)) + payload)
        while view:
            view = view[os.write(self.write_fd, view):]

    def recv(self):
        """The next message; ``EOFError`` if the peer closed its end or ended."""
        buffer = self._buffer
        while True:
            if len(buffer) >= _HEADER.size:
                size = _HEADER.unpack_from(buffer)[0]
                end = _HEADER.size + size
                if len(buffer) >= end:
                    obj = pickle.loads(memoryview(buffer)[_HEADER.size:end])
                    del buffer[:end]
                    return obj
                want = end - len(buffer)
            else:
                want = _HEADER.size
            buffer += self._read(max(min(want, _CHUNK), 65536))

    def _read(self, size: int) -> bytes:
        """Up to ``size`` bytes, polling for :data:`SPIN_TIME` seconds, then sleeping in
        ``poll`` and checking that the peer is alive every :data:`CHECK_TIME` seconds."""
        fd = self.read_fd
        started = time.perf_counter()
        while True:
            try:
                data = os.read(fd, size)
            except BlockingIOError:
                if time.perf_counter() - started >= SPIN_TIME:
                    self._sleep()
                continue
            if not data:
                raise EOFError("the channel's peer closed its end")
            return data

    def _sleep(self) -> None:
        """Wait until there is something to read or :data:`CHECK_TIME` passed; ``EOFError``
        if then the peer has ended."""
        if self._poller is None:
            self._poller = select.poll()        # (no descriptor limit, unlike select())
            self._poller.register(self.read_fd, select.POLLIN)
        if not self._poller.poll(CHECK_TIME * 1000) and not self.peer_alive():
            raise EOFError("the channel's peer ended")

    def close(self) -> None:
        """Close both descriptors (once)."""
        for fd in (self.read_fd, self.write_fd):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.read_fd = self.write_fd = -1


def _child(mine: tuple, theirs: tuple, parent: int, target, args: tuple) -> None:
    for fd in theirs:
        os.close(fd)
    target(SpinChannel(*mine, lambda: os.getppid() == parent), *args)


def start_worker(target, args: tuple = (), daemon: bool = True):
    """Fork a process running ``target(channel, *args)``; the forked process and this side's
    :class:`SpinChannel` to it. The worker's channel reports its peer ended when this process
    has (the worker is re-parented); this side's when the worker has. Linux only, as
    :func:`use_spin` says (elsewhere a ValueError: forking there is not safe)."""
    if not sys.platform.startswith("linux"):
        raise ValueError("a polled channel needs forked workers (Linux), not "
                         f"{sys.platform!r}")
    down_read, down_write = os.pipe()       # this process -> the worker
    up_read, up_write = os.pipe()           # the worker -> this process
    mine, theirs = (up_read, down_write), (down_read, up_write)
    ctx = multiprocessing.get_context("fork")
    process = ctx.Process(target=_child, args=(theirs, mine, os.getpid(), target, args),
                          daemon=daemon)
    process.start()
    for fd in theirs:
        os.close(fd)
    return process, SpinChannel(*mine, process.is_alive)
