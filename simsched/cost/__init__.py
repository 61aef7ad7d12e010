"""Iteration cost: the Batch a scheduler hands over, cost models, the hardware catalog, calibration.

Import direction inside: ``factory -> calibrated -> calibration -> hardware``; ``base`` (Batch
and the simple models) imports nothing of simsched.
"""
