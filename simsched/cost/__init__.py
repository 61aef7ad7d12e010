"""Iteration cost: the Batch a scheduler hands over, cost models, the hardware catalog, calibration.

Import direction inside: ``factory -> calibrated -> {serving, vllm_v1} -> {overhead, kernels}
-> profiles -> {calibration, calibration_h200} -> {fits, linalg, hardware}``; ``report`` sits on
top for the experiments; ``base`` (Batch and the simple models) imports nothing of simsched.
"""
