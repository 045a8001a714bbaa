"""p18: every published name stays servable."""
from _common import *  # noqa: F401,F403

from deltaserve_core.adapter_state import LoraAdapterState

H = host_module("18").Host


def check(cls):
    h = make(cls)
    base = ft_state(seed=FT_ADAPTER_SEED)
    names = [h.publish_adapter(LoraAdapterState("job", v, base.config, dict(base.tensors))) for v in range(1, 6)]
    refused = []
    for n in names:
        try:
            h.generate([ClientRequest(f"q-{n}", prompt(6, 1), 2, adapter=n)])
        except ValueError:
            refused.append(n)
    return not refused, f"published {names} (none retracted); refused afterwards: {refused or 'none'}"


run("p18", check, H)
