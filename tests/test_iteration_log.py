"""The iteration log: packed rows in, typed columns out, in order, however they are chunked."""

import numpy as np
import pytest

from simsched.engine import log as log_module
from simsched.engine.log import ITERATION_COLUMNS, PREFIX_COLUMNS, IterationLog, concat_frames


def _rows(n, start=0, width=len(ITERATION_COLUMNS)):
    # started_at, duration, then counts; swap_time last among the plain columns.
    out = []
    for i in range(start, start + n):
        row = [i * 0.5, 0.01 + i * 1e-6] + [i * 7 + j for j in range(width - 2)]
        row[8] = i * 1e-3 if width >= 9 else row[8]
        out.append(tuple(row))
    return out


def _log(rows, columns=ITERATION_COLUMNS):
    log = IterationLog(columns)
    for row in rows:
        log.values += log.pack(*row)        # what the GPU loop does
    return log


@pytest.mark.parametrize("chunk", [1, 3, 1 << 16])
def test_columns_come_out_typed_and_in_order_whatever_the_chunk(monkeypatch, chunk):
    monkeypatch.setattr(log_module, "_CHUNK_ROWS", chunk)
    rows = _rows(10)
    log = _log(rows)
    assert len(log) == 10
    assert list(log) == rows
    frame = log.frame()
    assert list(frame.columns) == list(ITERATION_COLUMNS)
    assert frame["num_seqs"].dtype == np.int64 and frame["started_at"].dtype == float
    assert [tuple(r) for r in frame.itertuples(index=False)] == rows
    assert len(log) == 0 and len(log.values) == 0          # emptied


@pytest.mark.parametrize("chunk", [2, 1 << 16])
def test_replicas_logs_concatenate_with_missing_prefix_columns_as_zero(monkeypatch, chunk):
    monkeypatch.setattr(log_module, "_CHUNK_ROWS", chunk)
    wide = ITERATION_COLUMNS + PREFIX_COLUMNS
    a, b = _rows(5), _rows(4, start=100, width=len(wide))
    frame = concat_frames([_log(a), _log(b, wide), _log([])])
    assert list(frame.columns) == ["replica"] + list(wide)
    assert frame["replica"].tolist() == [0] * 5 + [1] * 4
    assert frame["num_cached_tokens"].tolist()[:5] == [0] * 5
    assert [tuple(r)[1:] for r in frame.itertuples(index=False)] == \
        [r + (0, 0, 0) for r in a] + b


def test_append_checks_the_row_width():
    log = IterationLog()
    log.append(_rows(1)[0])
    with pytest.raises(ValueError, match="9 values"):
        log.append((1.0, 2.0))
    assert len(log) == 1


def test_the_engine_packs_each_row_as_the_log_names_its_columns():
    """Replica._gpu packs rows positionally (one C call an iteration): every pack call there
    must pass variables named exactly as the log's columns, in their order."""
    import ast
    import inspect
    import textwrap

    from simsched.engine.replica import Replica

    tree = ast.parse(textwrap.dedent(inspect.getsource(Replica._gpu)))
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Name) and node.func.id == "pack"]
    rows = sorted(tuple(a.id if isinstance(a, ast.Name) else ast.dump(a) for a in call.args)
                  for call in calls)
    assert rows == sorted([ITERATION_COLUMNS, ITERATION_COLUMNS + PREFIX_COLUMNS])


def test_the_log_keeps_its_buffer_after_being_read():
    log = IterationLog(ITERATION_COLUMNS)
    values = log.values
    log.append((0.5, 0.25, 7, 3, 4, 2, 11, 1, 0.0))
    assert len(log.frame()) == 1 and len(log) == 0
    log.append((0.5, 0.25, 7, 3, 4, 2, 11, 1, 0.0))
    assert log.values is values and len(log) == 1


def _run_rows(start, durations, n, waiting, used, growth):
    """The rows a quiet run of len(durations) steps logs, one packed row each (as before runs
    were kept compactly): the clock adds each duration in turn."""
    rows, at = [], start
    for j, d in enumerate(durations):
        used += growth[j]
        rows.append((at, d, 0, n, n, waiting[j] if waiting else 0, used, 0, 0.0))
        at += d
    return rows


@pytest.mark.parametrize("chunk", [1, 2, 3, 1 << 16])
def test_quiet_runs_come_out_as_the_rows_they_stand_for(monkeypatch, chunk):
    """add_run keeps a run compactly; every reader gives back its rows, in order, between the
    rows packed before and after it, whatever the chunking."""
    monkeypatch.setattr(log_module, "_CHUNK_ROWS", chunk)
    log = _log(_rows(2))
    expected = _rows(2)
    runs = [  # start, durations (more planned than taken), steps, n, waiting, used, growth
        (5.0, [0.1, 0.2, 0.30000000000000004, 0.4], 3, 7, 0, 100, [0, 7, 0]),
        (6.5, [0.01 * k for k in range(1, 21)], 20, 3, [0] * 12 + [1] * 5 + [2] * 3, 90,
         [3 if k % 4 == 1 else 0 for k in range(20)]),
        (9.0, [0.5, 0.25], 2, 1, [1, 1], 7, [1, 0]),
    ]
    for start, durations, m, n, waiting, used, growth in runs:
        times = [start]
        for d in durations:
            times.append(times[-1] + d)
        log.add_run(times, durations, m, n, waiting, used, growth)
        expected += _run_rows(start, durations[:m], n, waiting, used, growth)
        row = _rows(1, start=len(expected))[0]
        log.append(row)
        expected.append(row)
    assert len(log) == len(expected) == 2 + 3 + 20 + 2 + 3
    assert list(log) == expected                            # reading does not empty it
    frame = concat_frames([_log(_rows(1)), log])
    assert [tuple(r)[1:] for r in frame.itertuples(index=False)] == _rows(1) + expected
    assert frame["replica"].tolist() == [0] + [1] * len(expected)
    assert len(log) == 0 and len(log.values) == 0 and len(log.runs) == 0


def test_a_quiet_run_logs_as_each_step_would_in_a_simulation(monkeypatch):
    """A fleet's iteration frame with quiet runs is the one logged step by step (the run
    compaction is invisible): also checked bit for bit in tests/test_quiet_steps.py; here the
    runs are seen to be compact in the log while it fills."""
    import simsched
    from simsched import SimConfig
    from simsched.workloads.workload import WorkloadConfig

    seen = []
    original = IterationLog.add_run

    def spy(self, *args):
        seen.append(args[2])
        return original(self, *args)

    monkeypatch.setattr(IterationLog, "add_run", spy)
    # The classic preset: quiet runs are taken under the arrival rule, not when planning ahead.
    run = simsched.simulate(SimConfig.preset("classic", workload=WorkloadConfig(
        name="custom", lengths="uniform", prompt_range=(32, 256), output_range=(16, 200),
        rate=4.0, duration=10.0)))
    assert seen and max(seen) > 2
    decodes = run.iterations[run.iterations["num_prefill_tokens"] == 0]
    assert len(decodes) >= sum(seen)
    assert (run.iterations["num_prefill_tokens"] >= 0).all()
    assert (run.iterations["num_preempted"] == 0).all()
