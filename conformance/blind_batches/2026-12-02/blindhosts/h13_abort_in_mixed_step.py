"""The abort poll is guarded by 'step has fine-tuning rows' instead of 'step has only fine-tuning rows': mixed steps
poll should_abort too, and on True their fine-tuning rows are voided (the inference rows run on)."""
from ._base import Patchable


class Host(Patchable):
    name = "blind-h13"

    def _should_check_abort(self, li, ft_only, mixed_ft):
        self._cur_mixed = mixed_ft
        return True  # BUG: also for mixed steps

    def _on_abort_continue(self):
        return getattr(self, "_cur_mixed", False)
