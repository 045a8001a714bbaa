"""p29: lent base weights are views of the weights the engine computes with, never copies
(hooks.py, LendsBaseWeights.base_weights). Returning None (or not lending) is allowed; a control host that lends
its parameters shows the check accepts real views."""
import _common as c
import torch


class Lending(c.ReferenceHost):
    def base_weights(self):
        return {n: p.detach() for n, p in self.model.named_parameters()}


def check(cls):
    h = c.make(cls)
    lend = getattr(h, "base_weights", None)
    lent = lend() if lend is not None else None
    if lent is None:
        return True, "does not lend (allowed)"
    storages = {p.untyped_storage().data_ptr() for p in h.model.parameters()}
    names = {n for n, _ in h.model.named_parameters()}
    copies = [n for n, t in lent.items() if t.untyped_storage().data_ptr() not in storages]
    params = dict(h.model.named_parameters())
    wrong = [n for n, t in lent.items() if n in params and not torch.equal(t, params[n])]
    ok = not copies and not wrong and set(lent) == names
    return ok, f"lent {len(lent)} tensors: {len(copies)} are not views of the engine's weights; values differ: {len(wrong)}"


ok1, m1 = check(c.ReferenceHost)
ok2, m2 = check(Lending)
okb, mb = check(c.host_module("29").Host)
c.verdict("p29", ok1 and ok2, f"reference: {m1} | control lending views: {m2}", okb, mb)
