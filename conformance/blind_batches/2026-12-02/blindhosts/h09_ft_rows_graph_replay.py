"""The execution mode is decided from the proposed batch before injection: fine-tuning rows that join a small
pure-decode batch ride a graph replay (hooks do not fire, no captures), the record says GRAPH."""
from deltaserve_core.types import ExecutionMode

from ._base import GraphCapable


class Host(GraphCapable):
    name = "blind-h09"

    def _proposed_mode(self, rows):
        inf = [r for r in rows if r.sample is None]
        pre = sum(r.length for r in inf if r.past == 0 and r.fake_kv is None)
        dec = sum(1 for r in inf if r.past > 0 or r.fake_kv is not None)
        return self._natural_mode(pre, dec)

    def _fires_hooks(self, rows, ft_rows):
        return self._proposed_mode(rows) is ExecutionMode.EAGER  # BUG: graph replay, hooks never fire

    def _record_mode(self, rows, ft_rows):
        return self._proposed_mode(rows)  # BUG: FT rows do not force eager
