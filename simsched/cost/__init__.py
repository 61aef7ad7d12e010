"""Iteration cost: the Batch a scheduler hands over, cost models, the hardware catalog, calibration.

Import direction inside: ``factory -> calibrated -> {overhead, serving} -> kernels -> coefcache ->
{calibration, calibration_h200} -> hardware``; ``report`` sits on top for the experiments; ``base``
(Batch and the simple models) imports nothing of simsched.
"""
