"""Calibrating simsched to a deployment: measured runs replayed, terms fitted, profiles written.

:func:`simsched.fit.profile.calibrate` (also ``simsched.calibrate`` and ``simsched calibrate``)
takes measured runs (:mod:`simsched.analysis.measurements`), replays each
(:mod:`simsched.fit.replay`), fits the deployment terms (:mod:`simsched.fit.calibrate`) and
returns (and writes) a calibrated profile that ``hardware.profile`` loads
(:mod:`simsched.cost.deployment`).
"""
