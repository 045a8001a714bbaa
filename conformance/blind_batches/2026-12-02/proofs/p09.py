from common import *
from deltaserve_core.types import ExecutionMode
RULE = 'HostHooks.capture_activation: "Steps that carry fine-tuning rows must run eagerly so that capture hooks fire" (FT rows joining a 3-decode step)'
def check(cls):
    h = make(cls); st = ft_state(); s = sample(3, 16)
    icp, sink, steps = install(h, policy=lambda b, k: (s,) if (b.num_decode == 3 and not b.has_prefill and k < 3) else ())
    for i in range(3): h.submit(ClientRequest(f"r{i}", prompt(6, i), 3))
    drain(h)
    ft = [r for r in steps.records if 3 in r.finetune_sample_ids]
    if not ft: return False, "FT step has no record"
    modes = {r.mode for r in ft}
    if modes != {ExecutionMode.EAGER}: return False, f"FT-carrying steps reported {sorted(m.value for m in modes)}, captures {len(sink.layers())}"
    return check_captures(sink, {3: s}, st)
run_proof("h09_ft_rows_graph_replay", RULE, check, "blindhosts.h09_ft_rows_graph_replay:Host",
          extra_passing=("blindhosts.blind_graph_correct:Host",))
