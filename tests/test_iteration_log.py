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
