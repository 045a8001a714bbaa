"""p10: captures are the residual-stream input of each decoder layer (hooks.py, ActivationSink / layer_input)."""
import _common as c


def check(cls):
    samples = [c.sample(1, 10), c.sample(2, 14)]
    h, ic, sk, rec, ran = c.idle_capture(cls, samples)
    bad = c.capture_problems(h, sk, samples)
    return ran and not bad, f"idle step ran={ran}; captures vs PEFT hidden_states[layer]: {bad or 'all match'}"


c.run("p10", check, c.host_module("10").Host)
