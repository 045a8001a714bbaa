"""h11: graph_mode(batch) / ProposedBatch.mode agree with the record's mode for steps without fine-tuning rows."""
import sys
import _common as c


def check(cls):
    h = c.make(cls)
    ic, sink, recs = c.install(h)
    for i in range(2):
        h.submit(c.ClientRequest(f"r{i}", c.prompt(5, i), 4))
    c.drain(h)
    batches = {b.step_id: b for b in ic.batches}
    for r in recs:
        b = batches[r.step_id]
        if h.graph_mode(b) != r.mode or b.mode != r.mode:
            return False, f"step {r.step_id}: predicted {h.graph_mode(b).value}, ran {r.mode.value}"
        if r.mode not in h.capabilities().graph_modes:
            return False, f"mode {r.mode} not in graph_modes"
    return True, f"{len(recs)} steps agree"


sys.exit(c.verdict(check, "11"))
