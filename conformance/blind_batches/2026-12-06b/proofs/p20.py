"""p20: base_weights() lends every HF parameter under its name, with its shape and values, as views."""
from _common import *  # noqa: F403


def check(cls):
    h = make(cls)
    if not hasattr(h, "base_weights"):
        return True, "no base_weights() (the optional LendsBaseWeights capability is not offered: allowed)"
    lent = h.base_weights()
    from transformers import AutoModelForCausalLM

    ref = dict(AutoModelForCausalLM.from_pretrained(h.model_spec().path).named_parameters())
    params = [p for p in h.model.parameters()]
    missing = sorted(set(ref) - set(lent))
    extra = sorted(set(lent) - set(ref))
    shape = [(n, tuple(lent[n].shape), tuple(ref[n].shape)) for n in ref if n in lent and lent[n].shape != ref[n].shape]
    values = [n for n in ref if n in lent and lent[n].shape == ref[n].shape and not torch.equal(lent[n], ref[n])]
    views = [n for n in lent if not any(lent[n].untyped_storage().data_ptr() == p.untyped_storage().data_ptr()
                                        for p in params)]
    ok = not (missing or extra or shape or values or views)
    return ok, (f"lent {len(lent)} of {len(ref)}; missing {missing}, extra {extra}, wrong shape (name, lent, HF) "
                f"{shape}, wrong values {values}, not views {views}")


run_with_base("p20", check, base_module("_lending").LendingHost, host_module("20").Host)
