"""Workloads: arrival processes, length distributions, trace readers and the workload config.

Stands alone: imports nothing of simsched outside this package.
"""

from simsched.workloads.workload import WorkloadConfig, describe, generate

__all__ = ["WorkloadConfig", "describe", "generate"]
