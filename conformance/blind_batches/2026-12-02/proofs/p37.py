from common import *
RULE = 'LendsBaseWeights.base_weights: "each tensor is a *view* of a weight the engine computes with (never a copy: a copy costs what lending saves)"'
def check(cls):
    h = make(cls)
    lend = getattr(h, "base_weights", None)
    weights = lend() if lend else None
    if weights is None:
        return True, "does not lend (allowed)"
    ptrs = {p.untyped_storage().data_ptr() for p in h.model.parameters()}
    copies = [n for n, t in weights.items() if t.untyped_storage().data_ptr() not in ptrs]
    return not copies, f"{len(copies)} of {len(weights)} lent tensors are copies"
run_proof("h37_base_weights_copies", RULE, check, "blindhosts.h37_base_weights_copies:Host",
          extra_passing=("blindhosts.h37_base_weights_copies:Correct",))
