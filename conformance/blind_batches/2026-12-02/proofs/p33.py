from common import *
from deltaserve_core.types import ProposedBatch, ScheduledRequest
RULE = 'HostHooks.graph_mode: "Must be a pure function of the batch\'s shape and the host\'s configuration"'
def check(cls):
    h = make(cls); install(h)
    batch = ProposedBatch(0, 0.0, tuple(ScheduledRequest(f"q{i}", 0.0, 0, 10, 1, 0.0, 0.0) for i in range(20)))
    before = h.graph_mode(batch)
    for i in range(3): h.submit(ClientRequest(f"r{i}", prompt(6, i), 4))
    h.step()
    during = h.graph_mode(batch)
    return before == during, f"same 20-decode batch: {before.value} with an idle engine, {during.value} with 3 running"
run_proof("h33_graph_mode_reads_engine_state", RULE, check, "blindhosts.h33_graph_mode_reads_engine_state:Host",
          extra_passing=("blindhosts.blind_graph_correct:Host",))
