"""benchmarks/fleet_day.py reports against the bare SimPy loop by default (no timing asserted:
the test checks what the script runs and prints, not how fast)."""

from __future__ import annotations

import re

from benchmarks import fleet_day

TINY = ["--replicas", "2", "--hours", "0.003", "--start-hour", "14"]


def test_the_default_runs_both_loops_on_the_same_requests_and_prints_their_ratio(capsys):
    fleet_day.main(TINY)
    out = capsys.readouterr().out
    sim = re.search(r": (\d+) requests, (\d+) iterations, (\d+) finished\nwall ([\d.]+) s", out)
    bare = re.search(r"bare SimPy loop .*: wall ([\d.]+) s .*; (\d+) requests, (\d+) iterations",
                     out)
    ratio = re.search(r"simsched / bare loop: ([\d.]+)x wall, [\d.]+x CPU on the same requests",
                      out)
    assert sim and bare and ratio, out
    assert int(sim.group(1)) == int(bare.group(2)) > 0      # the same requests, all of them
    walls = float(sim.group(4)), float(bare.group(1))
    if min(walls) >= 0.5:          # printed to 0.1 s: the ratio is checkable to a few per cent
        assert abs(float(ratio.group(1)) - walls[0] / walls[1]) <= 0.25 * walls[0] / walls[1]


def test_either_loop_alone_prints_no_ratio(capsys):
    fleet_day.main(TINY + ["--loop", "floor"])
    out = capsys.readouterr().out
    assert "bare SimPy loop" in out and "simsched / bare loop" not in out
    assert "iterations, " not in out.split("bare SimPy loop")[0]    # simsched did not run
