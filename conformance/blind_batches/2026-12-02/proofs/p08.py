from common import *
RULE = ('HostHooks.graph_mode: "agree with the mode of the step\'s StepRecord whenever no fine-tuning rows were added" '
        '(12 concurrent decodes)')
def check(cls):
    h = make(cls); icp, sink, steps = install(h)
    for i in range(12): h.submit(ClientRequest(f"r{i}", prompt(6, i), 3))
    drain(h)
    probs = [f"step {b.step_id}: graph_mode {b.mode.value}, ran {r.mode.value}" for b in icp.batches
             for r in steps.by_step(b.step_id) if not r.finetune_sample_ids and r.mode != b.mode]
    return not probs, "; ".join(probs[:3]) or "graph_mode agrees with every record"
run_proof("h08_graph_mode_capture_sizes", RULE, check, "blindhosts.h08_graph_mode_capture_sizes:Host",
          extra_passing=("blindhosts.blind_graph_correct:Host",))
