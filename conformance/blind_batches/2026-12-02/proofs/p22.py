from common import *
RULE = ('ActivationSink.layer_input: "Called once per (layer, fine-tuning sample) of the step, in layer order, *before* '
        'the layer runs" (two samples; abort polls mark the layer boundaries)')
def check(cls):
    h = make(cls); ss = (sample(1, 10), sample(2, 12))
    icp, sink, steps = install(h, policy=lambda b, k: ss if k == 0 else ())
    h.run_idle_step()
    probs, polls, last_layer = [], 0, -1
    for e in sink.events:
        if e[0] == "abort?": polls += 1
        if e[0] == "layer":
            if e[2] < last_layer: probs.append(f"layer {e[2]} input after layer {last_layer}")
            if polls != e[2] + 1: probs.append(f"layer {e[2]} input (sample {e[3]}) delivered after boundary {polls - 1}")
            last_layer = e[2]
    return not probs, "; ".join(probs[:3]) or "in layer order, each before its layer"
run_proof("h22_capture_deferred_sample_major", RULE, check, "blindhosts.h22_capture_deferred_sample_major:Host")
