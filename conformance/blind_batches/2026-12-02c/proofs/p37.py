"""p37: lent base weights (if any) carry every name of AutoModelForCausalLM.named_parameters() (untied head)."""
from _common import *  # noqa: F403


def check(cls):
    h = make(cls)
    lend = getattr(h, "base_weights", None)
    if lend is None:
        return True, "does not lend (allowed: LendsBaseWeights is optional)"
    w = lend()
    if w is None:
        return True, "lends nothing (allowed)"
    names = {n for n, _ in hf_model().named_parameters()}
    missing, extra = sorted(names - set(w)), sorted(set(w) - names)
    return not missing and not extra, f"{len(missing)} names missing (e.g. {missing[:2]}), {len(extra)} unknown (e.g. {extra[:2]})"


run("p37", check, host_module("37").Host)
