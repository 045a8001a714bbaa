"""h24: the EOS token that stops a request is stripped from its output.

Rule (driver.py, ClientRequest): "With ``ignore_eos=False`` it must stop at the first EOS it generates, EOS included
as its last token".

Bug: the adapter's output path follows the engine's detokenizer defaults, which drop the stop token from the
returned output (vLLM's stop-token handling without ``include_stop_str_in_output``): a request that stops at EOS is
returned without it (and without its time).

Trigger: any request with ``ignore_eos=False`` that generates EOS before ``max_tokens``.
"""
from __future__ import annotations

from deltaserve_core.driver import ClientOutput
from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def step(self):
        outputs = []
        for o in super().step():
            if o.token_ids and o.token_ids[-1] in self.eos_ids and self._stopped_on_eos(o):
                times = o.token_times[:-1]
                o = ClientOutput(o.request_id, o.token_ids[:-1], o.arrival_time,
                                 times[0] if times else o.first_token_time,
                                 times[-1] if times else o.finish_time, times)
            outputs.append(o)
        return outputs

    def _is_done(self, s):
        done = super()._is_done(s)
        if done and not s.request.ignore_eos and s.output and s.output[-1] in self.eos_ids:
            self._eos_stopped = getattr(self, "_eos_stopped", set()) | {s.request.request_id}
        return done

    def _stopped_on_eos(self, o):
        return o.request_id in getattr(self, "_eos_stopped", set())
