"""The lesson's comparison: SPF beats FCFS on mean TTFT; the preemption row preempts more."""

from experiments import policy_comparison


def test_spf_lowers_mean_ttft_and_preemption_preempts(tmp_path):
    table = policy_comparison.main(["--num-requests", "400", "--out", str(tmp_path)])
    fcfs, spf, pre = (table.loc[p] for p in ("FCFS", "SPF", "SPF + preemption"))
    assert spf["ttft_mean"] < fcfs["ttft_mean"]
    assert pre["num_preemptions"] > spf["num_preemptions"]
    assert pre["num_recomputed_tokens"] > spf["num_recomputed_tokens"]
    assert (tmp_path / "fcfs_requests.csv").exists() and (tmp_path / "summary.csv").exists()
