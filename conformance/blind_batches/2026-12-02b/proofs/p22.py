"""h22: the name publish_adapter returns is servable (job name with capitals)."""
import sys
import _common as c


def check(cls):
    h = c.make(cls)
    name = h.publish_adapter(c.lora_state("AlpacaJob", seed=1, version=3))
    out = h.generate([c.ClientRequest("r", c.prompt(5), 2, adapter=name)])
    return True, f"served {name!r}: {out[0].token_ids}"


sys.exit(c.verdict(check, "22"))
