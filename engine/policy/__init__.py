"""The engine's torch-free policy: configs, sequences, the block manager, the scheduler, admission, decode
batching, sampling options, number formats and model descriptions. The simulator runs this very code,
so nothing under engine/policy/ imports torch (tests/simulator/test_imports.py checks every module)."""
