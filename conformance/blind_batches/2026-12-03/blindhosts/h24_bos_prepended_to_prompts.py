"""h24: the adapter prepends the tokenizer's BOS token to every client prompt.

Rule (driver.py, ClientRequest): "A greedy generation request: ``max_tokens`` new tokens after ``prompt_ids``" (the
prompt is token ids, taken as given).

Bug: the adapter hands prompts to the engine through its tokenizer path with ``add_special_tokens`` on (as for a
text prompt), which inserts BOS in front of ``prompt_ids`` unless they already start with it: the model continues
a different sequence (and every prefill is one token longer).
Trigger: every request whose prompt does not start with BOS.
"""
import dataclasses

from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def _enqueue(self, request) -> None:
        bos = self.model.config.bos_token_id
        if bos is not None and request.prompt_ids[:1] != (bos,):
            request = dataclasses.replace(request, prompt_ids=(int(bos),) + tuple(request.prompt_ids))
        super()._enqueue(request)
