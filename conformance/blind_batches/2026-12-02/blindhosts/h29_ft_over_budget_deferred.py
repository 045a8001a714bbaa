"""The adapter enforces the engine's per-step token budget (max_batch_tokens) on inference + fine-tuning tokens and
carries samples that do not fit over to the next step, although capabilities advertise the whole budget for FT."""
from ._base import Patchable


class Host(Patchable):
    name = "blind-h29"

    def _before_rows(self, samples, prefills, decodes):
        carried = tuple(self.__dict__.pop("_carry", ()))
        budget = self.config.max_batch_tokens - sum(len(s.request.prompt_ids) for s in prefills) - len(decodes)
        keep, carry = [], []
        for s in carried + tuple(samples):
            if s.num_tokens <= budget:
                keep.append(s)
                budget -= s.num_tokens
            else:
                carry.append(s)  # BUG: runs in a later step than the one it was returned for
        self._carry = carry
        return tuple(keep)

    def has_unfinished(self):
        return super().has_unfinished()
