"""p16: graph_mode agrees with the record's mode when no fine-tuning rows were added (hooks.py, graph_mode).
Reference: the reference host and the batch's correct graph host (_graphs.GraphHost)."""
import _common as c
from blindhosts._graphs import GraphHost


def check(cls):
    h = c.make(cls, client_adapters={"cl": str(c.adapter_dir("cl", seed=3))})
    ic, sk, rec = c.install(h)
    h.submit(c.req("r", 6, 12, 4, adapter="cl"))
    c.drain(h)
    modes = {r.step_id: r.mode for r in rec.records}
    bad = [(b.step_id, b.mode.value, h.graph_mode(b).value, modes[b.step_id].value) for b in ic.batches
           if not (b.mode == h.graph_mode(b) == modes[b.step_id])]
    return not bad, f"request on client adapter 'cl'; (step, batch.mode, graph_mode, record.mode) disagreeing: {bad or 'none'}"


ok1, m1 = check(c.ReferenceHost)
ok2, m2 = check(GraphHost)
okb, mb = check(c.host_module("16").Host)
c.verdict("p16", ok1 and ok2, f"reference: {m1} | correct graph host: {m2}", okb, mb)
