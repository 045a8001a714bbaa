"""The abort path returns before the record is emitted: an aborted fine-tuning-only step produces no StepRecord."""
from ._base import Patchable


class Host(Patchable):
    name = "blind-h23"

    def _deliver(self, record):
        if record.aborted_sample_ids:
            return  # BUG
        super()._deliver(record)
