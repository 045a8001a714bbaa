"""The engine loop sleeps while it has no client requests: a step with no inference rows is never offered to
on_schedule, so fine-tuning-only steps never happen."""
from ._base import Patchable


class Host(Patchable):
    name = "blind-h26"

    def run_idle_step(self):
        return False  # BUG: idle engine never calls on_schedule
