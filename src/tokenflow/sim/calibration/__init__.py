"""The simulator against real runs: ``timings`` (the runtime's ``calibration.json``), ``fit`` (rate
parameters fitted to it) and ``calibrate`` (``tokenflow simulate --calibrate``: fit, replay,
compare wall times).

May import: layer 1-5 records and the rest of ``tokenflow.sim``.
"""
