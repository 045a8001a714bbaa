"""capabilities().mixed_batches is computed from HostConfig.mixed_batches (None -> True) while the scheduler honours the
host option mixed_batches=false: a non-mixed engine advertises mixed batches."""
import dataclasses

from ._base import Patchable


class Host(Patchable):
    name = "blind-h39"

    def __init__(self, config):
        super().__init__(config)
        self._capabilities = dataclasses.replace(  # BUG: option ignored for the flag
            self._capabilities, mixed_batches=config.mixed_batches if config.mixed_batches is not None else True)
