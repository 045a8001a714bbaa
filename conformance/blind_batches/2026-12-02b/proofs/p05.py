"""h05: layer_input(layer L) arrives before the layer runs: before the abort poll at the boundary of layer L+1."""
import sys
import _common as c


def check(cls):
    h = c.make(cls)
    s = c.sample(6, 10)
    ic, sink, recs = c.install(h, plan=[(s,)])
    assert h.run_idle_step()
    ev = [e for e in sink.events if e[0] in ("input", "abort?")]
    polls = [i for i, e in enumerate(ev) if e[0] == "abort?"]
    for e_i, e in enumerate(ev):
        if e[0] == "input":
            layer = e[2]
            if layer + 1 < len(polls) and e_i > polls[layer + 1]:
                return False, f"layer_input(layer {layer}) came after the abort poll of layer {layer + 1}: {ev}"
    if len(polls) < 2:
        return False, f"expected one abort poll per layer, got {ev}"
    return True, f"interleaved {[e[0] for e in ev]}"


sys.exit(c.verdict(check, "05"))
