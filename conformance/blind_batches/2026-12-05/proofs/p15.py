"""p15: graph_mode is a pure function of the batch's shape and the host's configuration (hooks.py, graph_mode).
Reference: the reference host and the batch's correct graph host (_graphs.GraphHost)."""
import _common as c
from blindhosts._graphs import GraphHost


def check(cls):
    h = c.make(cls)
    ic, sk, rec = c.install(h)
    h.submit(c.req("r", 6, 11, 5))
    c.drain(h)
    by_shape, bad = {}, []
    for b in ic.batches:
        shape = (b.prefill_lengths, b.num_decode, len(b.waiting))
        by_shape.setdefault(shape, set()).add(b.mode.value)
        again = h.graph_mode(b)
        if again != b.mode:
            bad.append(f"step {b.step_id}: offered {b.mode.value}, graph_mode(same batch) now {again.value}")
    for shape, modes in by_shape.items():
        if len(modes) > 1:
            bad.append(f"shape {shape}: modes {sorted(modes)}")
    modes = {r.step_id: r.mode.value for r in rec.records}
    return not bad, f"batch modes {[b.mode.value for b in ic.batches]}, record modes {modes}; {bad or 'pure'}"


ok1, m1 = check(c.ReferenceHost)
ok2, m2 = check(GraphHost)
okb, mb = check(c.host_module("15").Host)
c.verdict("p15", ok1 and ok2, f"reference: {m1} | correct graph host: {m2}", okb, mb)
