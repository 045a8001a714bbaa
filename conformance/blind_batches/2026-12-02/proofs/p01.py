from common import *
RULE = ('ActivationSink.layer_input: "The input of decoder layer `layer` for one sample: shape [num_tokens, hidden_size]" '
        '(captures of FT rows that share a step with decode rows)')
def check(cls):
    h = make(cls); st = ft_state()
    s = sample(7, 24)
    icp, sink, steps = install(h, policy=lambda b, k: (s,) if (b.num_decode >= 3 and not b.has_prefill) else ())
    for i in range(3): h.submit(ClientRequest(f"r{i}", prompt(10 + i, i), 4))
    drain(h)
    assert sink.layers(), "sample never injected"
    return check_captures(sink, {7: s}, st)
run_proof("h01_capture_offset_ignores_decodes", RULE, check, "blindhosts.h01_capture_offset_ignores_decodes:Host")
