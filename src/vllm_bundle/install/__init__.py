"""The consumer's side: installing a released bundle (``installer``), and whether this machine can run it
(``doctor``, ``gpu_detect``). Runs with the runtime dependencies alone: nothing here imports the build
extra (tests/test_layering.py)."""
