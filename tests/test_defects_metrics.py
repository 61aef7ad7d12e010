"""User-facing metric, export and input defects of issue 24 (items 4-8, 12-14)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

import simsched
from simsched import SimConfig

README_CONFIG = dict(policy="spf", preemption=True, max_num_seqs=16, num_blocks=96, rate=30.0,
                     num_requests=1000, seed=1)


@pytest.fixture(scope="module")
def readme_run():
    return simsched.simulate(SimConfig().replace(**README_CONFIG))


# Item 4: one percentile rule (numpy's linear) in the summary, the samples and the vLLM export.

def test_summary_itl_percentiles_are_numpys_and_the_exports(readme_run):
    summary, samples = readme_run.summary(), readme_run.itl_samples()
    export = readme_run.to_vllm_bench(percentiles=(50, 90, 95, 99))
    for q in (50, 90, 95, 99):
        assert summary[f"itl_p{q}"] == np.percentile(samples, q)
        assert summary[f"itl_p{q}"] * 1000 == pytest.approx(export[f"p{q}_itl_ms"], rel=1e-12)


@pytest.mark.parametrize("bisect", [False, True])
def test_pooled_itl_percentiles_equal_numpy_on_the_expanded_sample(monkeypatch, bisect):
    from simsched.analysis import itl
    from simsched.analysis.itl import ItlSamples

    # Both paths: the joined sort (small runs) and the bisection (runs above BISECT_ABOVE).
    monkeypatch.setattr(itl, "BISECT_ABOVE", 0 if bisect else 10**9)
    rng = np.random.default_rng(3)
    qs = (0, 1, 33.3, 50, 90, 95, 99, 99.9, 100)
    for trial in range(300):
        n, m = int(rng.integers(0, 25)), int(rng.integers(0, 25))
        gaps = rng.integers(0, 5, n) / 4 if trial % 2 else rng.random(n) * 10.0 ** (trial % 5 - 2)
        counts = rng.integers(0, 4, n)
        other = rng.integers(0, 5, m) / 4 if trial % 3 else rng.random(m)
        store = ItlSamples(gaps, counts, other)
        got = store.percentiles(qs)
        if not len(store):
            assert all(math.isnan(v) for v in got)
            continue
        assert got == [float(v) for v in np.percentile(store.array(), qs)]


# Item 5: a disaggregated run's replicas frame counts the prefills each replica served.

def test_disaggregated_replicas_count_the_prefills_they_served():
    cfg = SimConfig().replace(num_replicas=5, num_prefill_replicas=2, num_decode_replicas=2,
                              rate=10.0, num_requests=200, disagg_min_prompt_tokens=100, seed=3)
    res = simsched.simulate(cfg)
    req, rep = res.requests, res.replicas.set_index("replica")
    prefills = req["prefill_replica"].value_counts()
    decodes = req["decode_replica"].value_counts()
    for r in range(5):
        assert rep.loc[r, "num_prefills"] == prefills.get(r, 0)
        assert rep.loc[r, "num_decodes"] == decodes.get(r, 0)
        served = ((req["prefill_replica"] == r) | (req["decode_replica"] == r)).sum()
        assert rep.loc[r, "num_requests"] == served
    for r in (0, 1):                      # the prefill replicas served every long prompt's prefill
        assert rep.loc[r, "num_requests"] == rep.loc[r, "num_prefills"] > 0
        assert rep.loc[r, "num_decodes"] == 0 and rep.loc[r, "num_finished"] == 0
    assert rep["num_prefills"].sum() == len(req) == rep["num_decodes"].sum()


def test_mixed_replicas_frame_keeps_its_columns():
    res = simsched.simulate(SimConfig().replace(num_replicas=2, rate=10.0, num_requests=50))
    assert "num_prefills" not in res.replicas.columns
    assert res.replicas["num_requests"].sum() == 50


# Item 6: requests due after the end of the run are not counted as unfinished.

def _cut_run():
    from simsched.cost.base import UnitCostModel

    # Request 1 decodes 1,000 tokens and is still running at t=50; request 2 is due at t=100.
    return simsched.simulate(SimConfig().replace(max_sim_time=50.0, max_num_seqs=4),
                             requests=[(0.0, 8, 5), (0.0, 8, 1000), (100.0, 8, 5)],
                             cost_model=UnitCostModel())


def test_requests_due_after_the_run_are_reported_apart():
    res = _cut_run()
    s = res.summary()
    assert (s["num_finished"], s["num_unfinished"], s["num_not_arrived"]) == (1, 1, 1)
    assert s["num_finished"] + s["num_rejected"] + s["num_unfinished"] \
        + s["num_not_arrived"] == s["num_requests"] == 3
    assert "1 unfinished, 1 not arrived" in repr(res)


def test_saturation_signals_do_not_count_requests_that_never_arrived():
    from simsched.analysis.slo import saturation_signals

    res = _cut_run()
    signals = saturation_signals(res.requests, res.iterations)
    assert signals["num_unfinished"] == 1 and signals["completion"] == 0.5


# Item 7: the rejection warning describes the whole category, not one request's numbers.

def test_rejection_warning_gives_the_category_with_its_range():
    from simsched.analysis.runner import RejectionWarning

    # Two over-long requests (4,200 and 5,010 tokens), one too big for a 20-block cache, one fine.
    requests = [(0.0, 4000, 200), (0.0, 3000, 10), (0.1, 5000, 10), (0.2, 100, 10)]
    with pytest.warns(RejectionWarning) as caught:
        simsched.simulate(SimConfig().replace(num_blocks=20), requests=requests)
    (message,) = [str(w.message) for w in caught if w.category is RejectionWarning]
    assert message == ("3 of 4 requests rejected; most common reason (2 of them): prompt + "
                       "output = 4200 to 5010 tokens exceeds max_model_len 4096; 1 for other "
                       "reasons")


def test_rejection_note_keeps_a_number_shared_by_the_whole_category():
    import pandas as pd

    from simsched.analysis.metrics import rejection_note

    frame = pd.DataFrame({"status": ["rejected"] * 3 + ["finished"],
                          "reject_reason": ["shed: rate limit of 2.5 requests/s exceeded"] * 3
                          + [""]})
    assert rejection_note(frame) == ("3 of 4 requests rejected; most common reason (3 of them): "
                                     "shed: rate limit of 2.5 requests/s exceeded")


# Item 8: docs/experiments.md's prefix-caching figures come from the study, checked by check_docs.

def test_experiments_doc_quotes_prefix_caching_figures_only_from_a_generated_block():
    import re

    from tools.docs import check_docs

    file, body = check_docs.read_blocks()["experiments-prefix-caching"]
    assert file == "docs/experiments.md" == check_docs.BLOCKS["experiments-prefix-caching"].file
    assert re.search(r"hit\s+rate\s+\d\.\d\d\s+→\s+\d\.\d\d\s+at\s+2,048\s+blocks", body)
    outside = check_docs.BLOCK_RE.sub("", (check_docs.ROOT / file).read_text())
    assert not re.search(r"hit\s+rate[^.]*\d", outside), "a hand-written hit rate can go stale"


@pytest.mark.slow
def test_experiments_doc_prefix_caching_block_matches_the_study():
    import io

    from tools.docs import check_docs

    assert not check_docs.check(["experiments-prefix-caching"], out=io.StringIO())


# Item 12: the API refuses what the CLI refuses.

@pytest.mark.parametrize("empty", [[], ()], ids=["list", "tuple"])
def test_an_empty_request_list_is_refused(empty):
    with pytest.raises(ValueError, match=r"^requests is empty"):
        simsched.simulate(SimConfig(), requests=empty)


def test_an_empty_request_frame_is_refused():
    import pandas as pd

    frame = pd.DataFrame(columns=["arrival_at", "num_prompt_tokens", "num_output_tokens"])
    with pytest.raises(ValueError, match=r"^requests is empty"):
        simsched.simulate(SimConfig(), requests=frame)


@pytest.mark.parametrize("requests, where", [
    ([("1e3", "100", 10)], r"requests\[0\]\.arrival_at .* got '1e3'"),
    ([(0.0, 100, 10), (1.0, "100", 10)], r"requests\[1\]\.num_prompt_tokens .* got '100'"),
    ([{"arrival_at": 0.0, "num_prompt_tokens": 100, "num_output_tokens": "7"}],
     r"requests\[0\]\.num_output_tokens .* got '7'"),
    ([(0.0, 100, 10, "2")], r"requests\[0\]\.priority .* got '2'"),
])
def test_numeric_strings_are_refused_naming_row_and_column(requests, where):
    with pytest.raises(ValueError, match=where):
        simsched.simulate(SimConfig(), requests=requests)


def test_a_text_column_of_a_frame_is_refused():
    import pandas as pd

    frame = pd.DataFrame({"arrival_at": [0.0, 1.0], "num_prompt_tokens": ["5", "6"],
                          "num_output_tokens": [3, 4]})
    with pytest.raises(ValueError, match=r"requests\[0\]\.num_prompt_tokens .* got '5'"):
        simsched.simulate(SimConfig(), requests=frame)


def test_an_unsorted_request_list_is_sorted_with_the_trace_loaders_warning():
    from simsched.workloads.trace_files import TraceWarning

    with pytest.warns(TraceWarning, match="requests: 2 arrival times out of order; sorted by "
                                          "arrival") as caught:
        res = simsched.simulate(SimConfig(), requests=[(1.0, 10, 5), (0.5, 10, 5), (0.2, 10, 5)])
    assert res.requests["arrival_at"].tolist() == [0.2, 0.5, 1.0]
    # Pointed at the caller's line, not at simsched's insides.
    assert caught[0].filename == __file__


def test_a_sorted_request_list_does_not_warn():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        simsched.simulate(SimConfig(), requests=[(0.0, 10, 5), (0.0, 10, 5), (0.2, 10, 5)])


# Item 13: the data-bundling scripts have a real command line and never overwrite by accident.

BUNDLERS = {"_bundle_a100_data": "a100-profiling", "_bundle_h200_real": ""}
ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = ROOT.parent / "shared" / "data"      # the raw data, beside the checkout


def _bundle_main(name, argv, capsys):
    import importlib

    module = importlib.import_module(f"experiments.{name}")
    with pytest.raises(SystemExit) as exc:
        module.main(argv)
    return exc.value.code, capsys.readouterr().err


@pytest.mark.parametrize("name", BUNDLERS)
def test_bundlers_refuse_quick_and_missing_or_bad_arguments(name, capsys, tmp_path):
    code, err = _bundle_main(name, ["--quick"], capsys)
    assert code == 2 and "--quick" in err and "no quick mode" in err
    code, err = _bundle_main(name, [], capsys)
    assert code == 2 and "SOURCE is required" in err
    code, err = _bundle_main(name, [str(tmp_path / "nope"), "--write"], capsys)
    assert code == 2 and f"source folder {tmp_path / 'nope'} does not exist" in err
    code, err = _bundle_main(name, [str(tmp_path), "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and f"source folder {tmp_path} lacks" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="needs the shared raw data folder")
@pytest.mark.parametrize("name", BUNDLERS)
def test_bundlers_need_an_explicit_destination_and_reproduce_the_bundle(name, capsys, tmp_path):
    import filecmp
    import importlib

    from experiments._common import BUNDLED_DATA

    source = SHARED_DATA / BUNDLERS[name]
    code, err = _bundle_main(name, [str(source)], capsys)
    assert code == 2 and "--out DIR, or --write" in err
    argv = [str(source), "--out", str(tmp_path)]
    if name == "_bundle_h200_real":
        argv += ["--iteration-json",
                 str(ROOT / "benchmarks" / "device" / "h200_iteration_results.json")]
    assert importlib.import_module(f"experiments.{name}").main(argv) == 0
    written = [p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file()]
    assert len(written) >= 7
    for rel in written:
        if filecmp.cmp(tmp_path / rel, BUNDLED_DATA / rel, shallow=False):
            continue
        # Group means printed to 5 significant digits: pandas versions sum a group in different
        # orders, so a value on a rounding tie may print one unit apart in its last digit.
        assert rel.suffix == ".csv", rel
        import pandas as pd

        ours, shipped = pd.read_csv(tmp_path / rel), pd.read_csv(BUNDLED_DATA / rel)
        assert list(ours.columns) == list(shipped.columns) and len(ours) == len(shipped), rel
        for col in ours.columns:
            if pd.api.types.is_float_dtype(shipped[col]):
                np.testing.assert_allclose(ours[col], shipped[col], rtol=1.1e-4, atol=0,
                                           err_msg=f"{rel}: {col}")
            else:
                assert ours[col].tolist() == shipped[col].tolist(), (rel, col)


# Item 14: progress without carriage returns in logs; an opt-in progress display for one run.

SMALL = dict(num_requests=300, rate=20.0, num_blocks=200)


def _jobs():
    from simsched.analysis.executors import Job

    return [Job(SimConfig().replace(**SMALL, seed=s), keep_frames=False) for s in (0, 1)]


def test_sweep_progress_writes_no_carriage_returns_into_a_log(capsys):
    from simsched.analysis.executors import execute

    execute(_jobs(), executor="serial", progress=True)
    assert "\r" not in capsys.readouterr().err       # stderr is not a terminal here


def test_progress_in_a_log_is_plain_periodic_lines(capsys, monkeypatch):
    from simsched.analysis import progress
    from simsched.analysis.executors import execute

    monkeypatch.setattr(progress, "PLAIN_INTERVAL", 0.0)
    execute(_jobs(), executor="serial", progress=True, desc="sweep")
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" (")[0] for line in lines] == ["sweep: 1/2 runs", "sweep: 2/2 runs"]


def test_progress_bar_only_where_it_can_be_redrawn(monkeypatch):
    import io

    from tqdm.auto import tqdm

    from simsched.analysis import progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr("sys.stderr", Terminal())
    bar = progress.progress_bar(3, "sweep", "runs")
    assert isinstance(bar, tqdm)
    bar.close()
    monkeypatch.setattr("sys.stderr", io.StringIO())
    assert isinstance(progress.progress_bar(3, "sweep", "runs"), progress.PlainProgress)


def test_simulate_progress_is_opt_in_and_changes_nothing(capsys, monkeypatch):
    import pandas as pd

    from simsched.analysis import progress

    cfg = SimConfig().replace(**SMALL)
    off = simsched.simulate(cfg)
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(progress, "PLAIN_INTERVAL", 0.0)
    monkeypatch.setattr(progress, "WATCH_INTERVAL", 0.001)
    on = simsched.simulate(cfg, progress=True)
    err = capsys.readouterr().err
    assert "\r" not in err
    assert err.splitlines()[-1].startswith("simulate, arrived: 300/300 req, simulated ")
    for name in ("requests", "iterations", "preemptions", "replicas"):
        pd.testing.assert_frame_equal(getattr(on, name), getattr(off, name))
    assert on.summary() == pytest.approx(off.summary(), nan_ok=True)


def test_simulate_without_progress_starts_no_watcher(monkeypatch):
    from simsched.analysis import runner

    def refuse(*args, **kwargs):
        raise AssertionError("a watcher was started without progress=True")

    monkeypatch.setattr(runner, "RunWatcher", refuse)
    simsched.simulate(SimConfig().replace(**SMALL))


@pytest.mark.parametrize("tty", [False, True])
def test_cli_run_shows_progress_only_on_a_terminal(tty, monkeypatch, tmp_path):
    from simsched.analysis import executors
    from simsched.cli import main

    asked = []
    real = executors.run_config

    def spy(config, slos=None, progress=False, record_steps=False):
        asked.append(progress)
        return real(config, slos, progress=False, record_steps=record_steps)

    monkeypatch.setattr(executors, "run_config", spy)
    monkeypatch.setattr("sys.stderr.isatty", lambda: tty)
    assert main(["run", "--num-requests", "20", "--out", str(tmp_path)]) == 0
    assert asked == [tty]


def test_cli_run_prints_requests_not_arrived_apart(tmp_path, capsys):
    import pandas as pd

    from simsched.cli import main

    # 40 requests at 1/s, cut at 10 s: about 30 are due after the end of the run.
    assert main(["run", "--num-requests", "40", "--rate", "1", "--max-sim-time", "10",
                 "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    header, values = lines[0].split(), lines[1].split()
    summary = pd.read_csv(tmp_path / "summary.csv").iloc[0]
    assert header[:4] == ["num_finished", "num_rejected", "num_unfinished", "num_not_arrived"]
    assert int(values[3]) == summary["num_not_arrived"] > 20
    assert int(values[2]) == summary["num_unfinished"] < 10
