"""Profiling: timing the engine's operators and collectives on the device at hand (`servecast profile`),
and importing Vidur's profiles. profiler, operator_timing, header and collectives import torch; plan,
vidur and the package itself do not."""
