"""p06: graph_mode(batch) / ProposedBatch.mode agree with the record's mode for steps without fine-tuning rows."""
from _common import *  # noqa: F403

H = host_module("06").Host


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    h.generate([ClientRequest("a", prompt(6, 1), 4), ClientRequest("b", prompt(9, 2), 4)])
    modes = {r.step_id: r.mode for r in rec.records}
    bad = [(b.step_id, b.mode.value, h.graph_mode(b).value, modes.get(b.step_id).value)
           for b in ic.batches if b.step_id in modes and (b.mode != modes[b.step_id] or h.graph_mode(b) != modes[b.step_id])]
    caps = sorted(m.value for m in h.capabilities().graph_modes)
    return not bad and len(modes) == 4, (f"{len(modes)} steps, declared graph_modes {caps}; "
                                         f"(step, batch.mode, graph_mode, record.mode) disagreeing: {bad}")


run("p06", check, H)
