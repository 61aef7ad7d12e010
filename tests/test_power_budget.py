"""A fleet power budget as a constraint of the autoscaler (issue 46, item 3)."""

from __future__ import annotations

import numpy as np
import pytest

import simsched
from simsched import SimConfig
from simsched.config import ClusterConfig
from simsched.config.autoscaling import AutoscalingConfig
from simsched.cost.power import POWER_SPECS


def _config(budget, pools=(), num_replicas=1):
    auto = AutoscalingConfig(policy="threshold", metric="running", target=4.0, interval=0.5,
                             provisioning_time=1.0, model_load_time=0.5, max_replicas=8,
                             scale_down_window=5.0, power_budget_watts=budget, pools=pools)
    return SimConfig().replace(rate=60.0, num_requests=1200, seed=1, cluster=ClusterConfig(
        num_replicas=num_replicas, autoscaling=auto))


def _most_live(units) -> int:
    times = np.unique(np.concatenate([units["requested_at"], units["stopped_at"].dropna()]))
    return max(int(((units["requested_at"] <= t) & ~(units["stopped_at"] <= t)).sum())
               for t in times)


def test_the_budget_caps_live_replicas():
    free = simsched.simulate(_config(None))
    capped = simsched.simulate(_config(3 * 400.0))       # three A100s at 400 W
    assert _most_live(free.fleet.units) > 3
    assert _most_live(capped.fleet.units) == 3
    assert capped.requests["status"].eq("finished").all()


def test_a_budget_picks_the_pool_that_fits():
    pools = ({"name": "big", "price_per_hour": 1.0, "min_replicas": 0, "max_replicas": 8,
              "tensor_parallel_size": 2},
             {"name": "small", "price_per_hour": 2.0, "min_replicas": 1, "max_replicas": 8})
    res = simsched.simulate(_config(3 * 400.0, pools))   # the TP2 pool is cheaper but 800 W
    units = res.fleet.units
    watts = units["pool"].map({"big": 800.0, "small": 400.0})
    times = np.unique(units["requested_at"])
    for t in times:
        live = (units["requested_at"] <= t) & ~(units["stopped_at"] <= t)
        assert watts[live].sum() <= 1200.0
    assert (units["pool"] == "big").any()


@pytest.mark.parametrize("budget, match", [(-5.0, "power_budget_watts"),
                                           (300.0, "below the starting fleet's 400 W")])
def test_bad_budgets_are_refused(budget, match):
    with pytest.raises(ValueError, match=match):
        _config(budget)


def test_every_catalog_gpu_has_power_figures():
    # The shipped catalog, read in a fresh process (tests may register GPUs of their own).
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", "import json; from simsched.cost import hardware;"
                          " print(json.dumps(sorted(hardware.GPUS)))"], capture_output=True,
                         text=True, check=True).stdout
    shipped = set(json.loads(out))
    assert {"a100-80gb", "h200", "b200"} <= shipped
    assert shipped <= set(POWER_SPECS), shipped - set(POWER_SPECS)
