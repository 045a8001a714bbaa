"""Broken host: a second shutdown() raises (the engine's weights were already released).

Rule (src/deltaserve_core/driver.py, HostDriver.shutdown): "Stop the engine and free its memory; idempotent."

Bug: shutdown frees the model with ``del self.model`` (so the memory really goes back), which raises
AttributeError the next time.
Trigger: shutdown called twice, as an explicit stop followed by the context manager / atexit handler does.
"""
from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    name = "blind-h08"

    def shutdown(self) -> None:
        super().shutdown()
        del self.model  # BUG: not idempotent: the second call raises AttributeError
        self._inner = None
