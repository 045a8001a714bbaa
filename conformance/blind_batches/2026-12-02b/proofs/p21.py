"""h21: a request decoding on a published name is not continued with newer weights' KV mix (publish v2 mid-request)."""
import sys
import _common as c

P = c.prompt(8, 3)


def alone(cls, state):
    h = c.make(cls)
    name = h.publish_adapter(state)
    return h.generate([c.ClientRequest("x", P, 10, adapter=name)])[0].token_ids


def check(cls):
    v1, v2 = c.lora_state("job", seed=1, scale=0.6, version=1), c.lora_state("job", seed=2, scale=0.6, version=2)
    out1, out2 = alone(cls, v1), alone(cls, v2)
    h = c.make(cls)
    name = h.publish_adapter(v1)
    h.submit(c.ClientRequest("r", P, 10, adapter=name))
    h.step(); h.step(); h.step()
    h.publish_adapter(v2)
    got = c.drain(h)[0].token_ids
    if got not in (out1, out2):
        return False, f"output {got} is neither v1's {out1} nor v2's {out2}"
    return True, f"output is {'v1' if got == out1 else 'v2'}'s (v1 != v2: {out1 != out2})"


sys.exit(c.verdict(check, "21"))
