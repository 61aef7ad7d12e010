"""simsched: a discrete-event simulator of LLM serving schedulers, from one engine to a cluster."""

from simsched.analysis.slo import SLO
from simsched.api import make_requests, simulate
from simsched.analysis.capacity import SLOTarget, capacity_search
from simsched.analysis.plan import Candidate, plan
from simsched.config import CacheConfig, ClusterConfig, HardwareConfig, SchedulerConfig, SimConfig
from simsched.cost.base import Batch, LinearCostModel, UnitCostModel
from simsched.analysis.metrics import Results
from simsched.analysis.replicate import Replicates, replicate
from simsched.analysis.sweep import SweepResult, sweep
from simsched.workloads.workload import WorkloadConfig
from simsched.fit.profile import Calibration, calibrate

__all__ = ["simulate", "make_requests", "replicate", "Replicates", "SimConfig", "SchedulerConfig", "CacheConfig",
           "HardwareConfig", "WorkloadConfig", "ClusterConfig", "Batch", "LinearCostModel",
           "UnitCostModel", "Results", "sweep", "SweepResult", "SLO", "SLOTarget",
           "capacity_search", "plan", "Candidate", "calibrate", "Calibration"]
__version__ = "0.1.0"
