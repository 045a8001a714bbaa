"""LendsBaseWeights implemented with copies (clone 'to be safe'), not views of the weights the engine computes with."""
from ._base import Patchable


class Host(Patchable):
    name = "blind-h37"

    def base_weights(self):
        return {n: p.detach().clone() for n, p in self.model.named_parameters()}  # BUG: copies


class Correct(Patchable):
    name = "blind-h37-correct"

    def base_weights(self):
        return {n: p.detach() for n, p in self.model.named_parameters()}
