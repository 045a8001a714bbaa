"""Async-engine timing bug: duration_s is taken when the forward was launched, not when the device finished."""
import time

from ._base import Patchable


class Host(Patchable):
    name = "blind-h07"

    def _timed_forward_start(self):
        self._launch_end = time.monotonic()  # BUG: 'launch returned' stands in for 'device finished'
