"""TEST-ONLY: applies the pin_memory shim in every Python process started with this folder on PYTHONPATH
(SGLang's scheduler/detokenizer subprocesses in tests/sglang). See deltaserve_pin_memory_shim.py for why."""

try:
    import deltaserve_pin_memory_shim

    deltaserve_pin_memory_shim.apply()
except ImportError:  # torch not installed in this interpreter: nothing to shim
    pass
