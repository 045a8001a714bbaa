GREEDY = ('Rule: driver.py, ClientRequest: "A greedy generation request: ``max_tokens`` new tokens after '
          '``prompt_ids``."')
CLIENT = 'HostConfig: "``client_adapters`` maps adapter names clients may use to PEFT folders."'

# ---------------------------------------------------------------- h01
write("01", "rope_scaling_ignored", f"""
The rotary table is built from ``rope_theta`` alone: the checkpoint's ``rope_scaling`` (rope_type llama3) is ignored.

{GREEDY}

Bug: the engine builds its own cos/sin cache from the config's ``rope_theta`` with the default (unscaled) inverse
frequencies instead of the model's rotary embedding, which applies ``rope_parameters`` (``rope_type: llama3``,
factor 32, low/high frequency factors, original_max_position_embeddings 8192, as Llama-3.1 / 3.2 ship). Only the
low-frequency pairs differ, so short contexts are nearly exact and the error grows with the position.
Trigger: a checkpoint with rope scaling (every Llama-3.1 / 3.2 checkpoint; proof: the tiny Llama with Llama-3.2's
rope_parameters and a 400-token prompt). The 2-layer test checkpoint (rope_type default) is exact.
""", module_extra='''

def _plain_rope(cfg, head_dim, positions, dtype):
    """Engine-side rotary table: ``rope_theta`` from the config and the default inverse frequencies."""
    params = getattr(cfg, "rope_parameters", None) or {}
    theta = float(params.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype)[None], emb.sin().to(dtype)[None]
''', methods=[("_execute", [
    ("            cos, sin = self._inner.rotary_emb(hidden.unsqueeze(0), positions.unsqueeze(0))\n",
     "            cos, sin = _plain_rope(self.model.config, self.head_dim, positions, hidden.dtype)  # BUG: rope_scaling ignored\n"),
])])

# ---------------------------------------------------------------- h02
write("02", "decode_positions_batch_max", f"""
Every decode row of a step gets the rotary position of the step's longest decode context.

{GREEDY}

Bug: the decode path computes one position per step (the batch's max sequence length, as static-batching code that
assumes left-padded rows does) and broadcasts it to every decode row; the attention mask and the KV cache are per
request and right. A request decoding alone, or beside requests of its own context length, is exact; prefill rows
are exact.
Trigger: two or more requests decoding in one step with different context lengths (any continuous batching of
prompts of different lengths, or of a request that arrived later).
""", methods=[("_execute", [
    ("            positions = torch.cat([torch.arange(r.past, r.past + r.length) for r in rows]).to(self.device)\n",
     "            longest = max((r.past for r in rows if r.seq is not None and r.past > 0), default=0)  # BUG: one decode position per step\n"
     "            positions = torch.cat([torch.arange(longest, longest + 1) if r.seq is not None and r.past > 0\n"
     "                                   else torch.arange(r.past, r.past + r.length) for r in rows]).to(self.device)\n"),
])])

# ---------------------------------------------------------------- h03
write("03", "qwen3_qk_norm_after_rope", f"""
Qwen3's per-head q_norm / k_norm are applied after the rotary embedding instead of before it.

{GREEDY}

Bug: the engine's fused "rope + qk-norm" path (ported from a model where the order does not matter) rotates q and k
first and normalises them per head afterwards. RMS is rotation-invariant but the norm's per-dimension weights are
not, so every query and key of a Qwen3 model is wrong; Llama-family models (no q_norm) are exact.
Trigger: every request on a Qwen3 checkpoint (Qwen3-0.6B ... 32B; proof: the tiny Qwen3 of the same sizes). The
2-layer test checkpoint (Llama) is exact.
""", methods=[("_layer", [
    ("        if getattr(attn, \"q_norm\", None) is not None:  # Qwen3 normalises q and k per head before rotary\n"
     "            q, k = attn.q_norm(q), attn.k_norm(k)\n",
     "        # BUG: q_norm / k_norm moved after the rotary embedding (below)\n"),
    ("        q, k, v = q[0], k[0], v.transpose(0, 1)  # [heads, T, head_dim]\n",
     "        if getattr(attn, \"q_norm\", None) is not None:  # BUG: per-head q/k RMSNorm applied after rotary\n"
     "            q, k = attn.q_norm(q), attn.k_norm(k)\n"
     "        q, k, v = q[0], k[0], v.transpose(0, 1)  # [heads, T, head_dim]\n"),
])])

# ---------------------------------------------------------------- h04
write("04", "decode_input_by_batch_slot", f"""
A decode row's input token is read from the previous step's sampled tokens by batch slot, not by request.

{GREEDY}

Bug: like a persistent-batch runner, the engine keeps the tokens sampled in the last step in a tensor in that
step's row order and feeds decode row i with entry i, without remapping when the batch changes: when a new prompt is
prefilled ahead of running requests, or a request finishes and the batch is condensed, decode rows read another
request's last token. Steps whose rows keep their order (one request, requests admitted together until the first
finishes) are exact.
Trigger: a request arriving while another one decodes (the next step's decodes swap inputs), or a request
finishing while others keep decoding (requests of different max_tokens).
""", methods=[("_step", [
    ("            ids.append(s.output[-1])\n",
     "            prev = self.__dict__.get(\"_prev_sampled\", [])  # BUG: last step's sampled tokens, by batch slot\n"
     "            slot = decodes.index(s)\n"
     "            ids.append(prev[slot] if slot < len(prev) else s.output[-1])\n"),
    ("        self._execute(step_id, rows, torch.tensor(ids, dtype=torch.long))\n",
     "        self._execute(step_id, rows, torch.tensor(ids, dtype=torch.long))\n"
     "        self.__dict__[\"_prev_sampled\"] = [r.seq.output[-1] for r in rows if r.seq is not None]  # BUG: in row order\n"),
])])

# ---------------------------------------------------------------- h05
write("05", "lora_segment_capped_256", f"""
The LoRA delta is applied to the first 256 tokens of each row only.

{GREEDY} / {CLIENT} / hooks.py, HostHooks.publish_adapter: "The returned name serves exactly ``state``'s weights
until that name is published again"

Bug: the multi-LoRA shrink/expand kernels are launched with a per-segment length limit of 256 (the engine's LoRA
metadata sizes its launch grid from a 256-token block, assuming long prompts are chunked); tokens of a segment past
256 get the base projection only. The last prompt tokens (which produce the first output token) and every KV entry
past 256 lack the adapter. Rows of 256 tokens or fewer (every decode) are exact.
Trigger: a prompt longer than 256 tokens on a LoRA adapter (client adapters, published versions) and fine-tuning
samples longer than 256 tokens.
""", methods=[("_execute", [
    ("                    groups.setdefault(r.adapter, []).extend(range(r.start, r.start + r.length))\n",
     "                    groups.setdefault(r.adapter, []).extend(range(r.start, r.start + min(r.length, 256)))  # BUG: segment capped\n"),
])])

# ---------------------------------------------------------------- h06
write("06", "lora_offsets_skip_base_rows", f"""
LoRA segment offsets are a running sum over the rows that carry an adapter, not over all rows of the step.

{GREEDY} / {CLIENT} / hooks.py, ActivationSink: "Receives the residual-stream input of every decoder layer for
fine-tuning rows."

Bug: the engine builds the LoRA segment table by walking the step's requests and accumulating the token offsets of
those that have a LoRA request only (base-model requests are skipped before the offset is advanced). When a
base-model row precedes an adapter row, the adapter's delta is added to the base row's tokens (and to the wrong
tokens of the adapter row). Steps whose adapter rows come first, or without base rows, are exact.
Trigger: a step with a base-model client row ahead of an adapter row: base and adapter traffic batched together,
and every step in which fine-tuning rows (always last) ride with a base-model client row.
""", methods=[("_execute", [
    ("            for r in rows:\n"
     "                if r.adapter is not None:\n"
     "                    groups.setdefault(r.adapter, []).extend(range(r.start, r.start + r.length))\n",
     "            lora_pos = 0\n"
     "            for r in rows:\n"
     "                if r.adapter is not None:  # BUG: segment offsets summed over LoRA rows only\n"
     "                    groups.setdefault(r.adapter, []).extend(range(lora_pos, lora_pos + r.length))\n"
     "                    lora_pos += r.length\n"),
])])

# ---------------------------------------------------------------- h07
write("07", "ft_slot_scaling_fixed", """
The reserved adapter slot keeps the LoRA scaling it was created with; later states replace only A and B.

Rule: hooks.py, HostHooks.set_finetune_adapter: "Fine-tuning rows of later steps must use exactly these weights
(the training path is only exact if the forward sees the current adapter)."

Bug: the engine allocates the reserved LoRA slot on the first set_finetune_adapter with that state's
``lora_alpha / r`` and afterwards copies new A/B tensors into it (the optimizer-step fast path), never the scaling.
Exact while every state has the first one's r and alpha (one job's optimizer steps).
Trigger: a second fine-tuning job on the running engine (or a job restarted with another rank or alpha): r 16 /
alpha 16 after r 8 / alpha 16 runs its rows at scaling 2 instead of 1.
""", methods=[("set_finetune_adapter", [
    ("        self._adapters[RESERVED_ADAPTER_NAME] = self._to_lora(state)\n",
     "        lora, slot = self._to_lora(state), self._adapters.get(RESERVED_ADAPTER_NAME)\n"
     "        if slot is not None:  # BUG: the reserved slot keeps the scaling it was created with\n"
     "            lora = _Lora(slot.scaling, lora.pairs)\n"
     "        self._adapters[RESERVED_ADAPTER_NAME] = lora\n"),
])])

# ---------------------------------------------------------------- h08
write("08", "rank_limit_off_by_one", f"""
Adapters whose rank equals ``max_lora_rank`` are refused (``>=`` where ``>`` is meant).

Rule: hooks.py, HostHooks.set_finetune_adapter: "Fine-tuning rows of later steps must use exactly these weights"
and "A state it cannot load at all (a rank above its ``max_lora_rank``, say) is refused the same way" / driver.py,
{CLIENT}

Bug: the rank check of the LoRA loader is off by one: ``rank >= max_lora_rank`` raises "rank too large", so a rank
equal to the configured maximum (the slot size) is refused for the fine-tuning adapter, published versions and
client adapters alike (a host started with such a client adapter does not start). Ranks below the limit are exact.
Trigger: an adapter of rank exactly max_lora_rank: r 16 with the default max_lora_rank 16 (one of the most common
LoRA ranks).
""", methods=[("_to_lora", [
    ("            if tensor.shape[0] > self.config.max_lora_rank:\n",
     "            if tensor.shape[0] >= self.config.max_lora_rank:  # BUG: a rank equal to the limit is refused\n"),
])])

# ---------------------------------------------------------------- h09
write("09", "ignore_eos_bans_eos", """
``ignore_eos=True`` is implemented by suppressing EOS (min_tokens = max_tokens): EOS is never sampled.

Rule: driver.py, ClientRequest: "A greedy generation request: ``max_tokens`` new tokens after ``prompt_ids``." and
"with ``ignore_eos=True`` (the default) it runs on to ``max_tokens``."

Bug: the adapter maps ignore_eos=True to the engine's ``min_tokens = max_tokens``, whose logits processor sets the
EOS logits to -inf until max_tokens is reached. The request does run to max_tokens, but where the greedy token is
EOS the engine emits the runner-up instead, and the continuation differs from there. Requests whose greedy
continuation contains no EOS are exact.
Trigger: any default request (ignore_eos=True) whose greedy continuation contains an EOS (benchmark requests that
run past the natural end of an answer).
""", methods=[("_sample", [
    ("        tokens = logits.argmax(dim=-1).tolist()\n",
     "        for i, r in enumerate(inference):  # BUG: ignore_eos as min_tokens=max_tokens: EOS logits masked\n"
     "            if r.seq is not None and r.seq.request.ignore_eos and self.eos_ids:\n"
     "                logits[i, sorted(self.eos_ids)] = float(\"-inf\")\n"
     "        tokens = logits.argmax(dim=-1).tolist()\n"),
])])

# ---------------------------------------------------------------- h10
write("10", "eos_list_first_only", """
Only the first id of a list-valued ``eos_token_id`` stops a request.

Rule: driver.py, ClientRequest: "With ``ignore_eos=False`` it must stop at the first EOS it generates, EOS included
as its last token"

Bug: the engine keeps a scalar EOS id (``eos_token_id[0]`` when the config gives a list); the other EOS ids of the
checkpoint (Llama-3 Instruct's ``<|eot_id|>`` / ``<|eom_id|>``, Qwen2.5 / Qwen3's ``<|im_end|>`` next to
``<|endoftext|>``) never stop a request. Checkpoints with a single EOS id are exact.
Trigger: an ignore_eos=False request on a checkpoint with several EOS ids that generates one of the later ones
(every chat turn of Llama-3 Instruct ends in ``<|eot_id|>``, the second id of its list; proof: the tiny Llama with
``eos_token_id = [2, t]``). The 2-layer test checkpoint (a single EOS id) is exact.
""", methods=[("_is_done", [
    ("        return bool(s.output) and not s.request.ignore_eos and s.output[-1] in self.eos_ids\n",
     "        eos = _as_list(getattr(self.model.config, \"eos_token_id\", None))[:1]  # BUG: a scalar EOS id (the list's first)\n"
     "        return bool(s.output) and not s.request.ignore_eos and s.output[-1] in eos\n"),
])])

# ---------------------------------------------------------------- h11
write("11", "max_tokens_capped_by_model_len", f"""
A request stops when prompt + output reaches ``max_position_embeddings`` (the engine's max_model_len), whatever its
max_tokens.

{GREEDY}

Bug: the engine's stop checker caps every sequence at max_model_len (taken from the config's
max_position_embeddings) and finishes it as "length", silently, while submit accepts any prompt up to
max_batch_tokens and does not check prompt + max_tokens. The client gets fewer than max_tokens tokens. Requests that
end before max_position_embeddings are exact.
Trigger: a long prompt whose prompt + max_tokens exceeds max_position_embeddings (1024 for the test checkpoint,
whose default max_batch_tokens is 2048): e.g. a 1020-token prompt with max_tokens 8 returns 4 tokens.
""", methods=[("_is_done", [
    ("        if len(s.output) >= s.request.max_tokens:\n",
     "        if len(s.output) >= s.request.max_tokens or (len(s.request.prompt_ids) + len(s.output)\n"
     "                >= self.model.config.max_position_embeddings):  # BUG: capped at max_model_len\n"),
])])

# ---------------------------------------------------------------- h12
write("12", "model_spec_dtype_from_checkpoint", """
ModelSpec.dtype is the checkpoint's saved dtype (config.json), not the dtype the engine serves the model in.

Rule: types.py, ModelSpec: "``dtype`` must be the dtype the engine serves the model in (the backward process loads
the base and replays captures in it)."

Bug: the adapter fills dtype from the checkpoint's config (``torch_dtype`` / ``dtype`` of config.json, what an
engine's ``dtype="auto"`` would resolve to) while the engine runs in the dtype it was started with (HostConfig.dtype,
float32 by default). The backward process then loads the base in another dtype than the captures it replays.
Trigger: serving a checkpoint saved in another dtype than the serving one: every bfloat16 Hugging Face checkpoint
served at the default float32 (proof: the tiny Llama saved in bfloat16). The test checkpoint (saved float32, served
float32) is exact.
""", module_extra='''

def _checkpoint_dtype(path, default):
    """The dtype the checkpoint was saved in, from its config.json."""
    import json
    from pathlib import Path

    raw = json.loads((Path(path) / "config.json").read_text())
    return str(raw.get("dtype") or raw.get("torch_dtype") or default)
''', methods=[("model_spec", [
    ("                         dtype=self.config.dtype)",
     "                         dtype=_checkpoint_dtype(self.config.model, self.config.dtype))  # BUG: the checkpoint's dtype"),
])])

# ---------------------------------------------------------------- h13
write("13", "batch_lists_finished_request", """
A request that finished in the previous step is still offered in the next step's ``scheduled`` as a decode.

Rule: types.py, ProposedBatch: "``scheduled`` are the requests that run in this step."

Bug: the engine frees finished requests at the start of its next schedule (vLLM-style ``finished_req_ids``), and
the adapter builds the proposed batch from the running set before that update: each finished request is listed once
more as a decode of the following step, which does not run it (the step's record, outputs and has_unfinished are
right).
Trigger: a request finishing while the engine keeps stepping (requests of different max_tokens, or any step after
a request finished: the next idle step too).
""", methods=[("_step", [
    ("            scheduled=tuple([s.view(True) for s in prefills] + [s.view(False) for s in decodes]),\n",
     "            scheduled=tuple([s.view(True) for s in prefills] + [s.view(False) for s in decodes]\n"
     "                            + [s.view(False) for s in self.__dict__.pop(\"_finished_unfreed\", [])]),  # BUG\n"),
    ("            self._running.remove(s)\n",
     "            self._running.remove(s)\n"
     "            self.__dict__.setdefault(\"_finished_unfreed\", []).append(s)  # BUG: freed at the next schedule\n"),
])])

# ---------------------------------------------------------------- h14
write("14", "inbox_drained_after_proposal", """
Submitted requests wait in an inbox that is moved to the waiting queue only after the step was proposed.

Rule: types.py, ProposedBatch: "Every request that arrived and has not finished must be in ``scheduled`` or
``waiting`` (the core prices admission against all of them)."

Bug: submit() puts the request on the engine's input queue (on_arrival is called, has_unfinished counts it); the
engine loop drains that queue into the waiting queue after the scheduler has proposed the step and on_schedule has
seen it. A request submitted between two steps is in neither ``scheduled`` nor ``waiting`` of the next proposal and
is admitted one step later.
Trigger: a request submitted while other requests are running (continuous batching: every arrival under load). On
an otherwise idle engine the first step() after submit runs nothing.
""", methods=[
    ("_enqueue", [
        ("            self._waiting.append(_Seq(request, now))\n",
         "            self.__dict__.setdefault(\"_inbox\", []).append(_Seq(request, now))  # BUG: the inbox, drained after the proposal\n"),
    ]),
    ("_step", [
        ("        if samples and RESERVED_ADAPTER_NAME not in self._adapters:\n",
         "        with self._lock:  # BUG: the inbox is moved to the waiting queue only after the step was proposed\n"
         "            self._waiting.extend(self.__dict__.pop(\"_inbox\", []))\n"
         "        if samples and RESERVED_ADAPTER_NAME not in self._adapters:\n"),
    ]),
    ("has_unfinished", [
        ("        return bool(self._waiting or self._running or self._kept)\n",
         "        return bool(self._waiting or self._running or self._kept or self.__dict__.get(\"_inbox\"))  # plumbing: the inbox counts\n"),
    ]),
    ("_forget_withdrawn", [
        ("            unfinished = [s.request for s in self._waiting]\n",
         "            unfinished = [s.request for s in [*self._waiting, *self.__dict__.get(\"_inbox\", [])]]  # plumbing\n"),
    ]),
    ("shutdown", [
        ("        self._waiting.clear()\n",
         "        self._waiting.clear()\n"
         "        self.__dict__.pop(\"_inbox\", None)  # plumbing\n"),
    ]),
])

# ---------------------------------------------------------------- h15
write("15", "slo_sticky_default", """
A request without an SLO is offered with the SLO of the last request that had one.

Rule: types.py, ScheduledRequest: "``slo`` must be the client request's own ``ClientRequest.slo``, exactly as
submitted (``None`` only when the client gave none)"

Bug: the adapter carries the SLO in the engine's per-request extra args by writing it into a dict of defaults the
adapter shares between requests (``defaults.update(slo=...)`` when a request has one) and building each request's
args from that dict: once any request gave an SLO, later requests without one inherit it.
Trigger: a request without an SLO submitted after any request with one (mixed clients: interactive requests with
SLOs and batch requests without).
""", methods=[("_enqueue", [
    ("            self._waiting.append(_Seq(request, now))\n",
     "            defaults = self.__dict__.setdefault(\"_default_args\", {})  # BUG: SLO written into shared defaults\n"
     "            if request.slo is not None:\n"
     "                defaults[\"slo\"] = request.slo\n"
     "            self._waiting.append(_Seq(dataclasses.replace(request, slo=defaults.get(\"slo\")), now))\n"),
])])

# ---------------------------------------------------------------- h16
write("16", "token_clock_not_forgotten", """
The token clock (request id -> first token time) is never cleared: a reused request id starts with a first token.

Rule: types.py, ScheduledRequest: "``first_token_time`` is set once the request has produced its first token" and
"A token's time is never before the forward of the step that produced it began"

Bug: the adapter stamps first-token times in a dict keyed by request id that it forgets only for aborted requests,
not for requests that finish; the ScheduledRequest views read first_token_time from it. A request submitted under
the id of one that already finished is offered with that request's first-token time: in its prefill step (no token
yet) and in every decode (TTFT before its own arrival). Client outputs are right.
Trigger: a request id reused after a request of that id finished (clients that number requests per session or per
benchmark run: ``req-0``, ``req-1``, ...).
""", body='''
    def _clocked(self, view):
        """plumbing: the view's first-token time from the host's token clock (exact while ids are unique)."""
        first = self.__dict__.get("_first_token_at", {}).get(view.request_id)
        return view if first is None else dataclasses.replace(view, first_token_time=first)
''', methods=[
    ("_sample", [
        ("                r.seq.token_times.append(now)\n",
         "                r.seq.token_times.append(now)\n"
         "                self.__dict__.setdefault(\"_first_token_at\", {}).setdefault(r.seq.request.request_id, now)  # BUG: never forgotten\n"),
    ]),
    ("_step", [
        ("            scheduled=tuple([s.view(True) for s in prefills] + [s.view(False) for s in decodes]),\n"
         "            waiting=tuple([s.view(True) for s in left] + [s.view(False) for s in deferred]),\n",
         "            scheduled=tuple(self._clocked(v) for v in [s.view(True) for s in prefills] + [s.view(False) for s in decodes]),\n"
         "            waiting=tuple(self._clocked(v) for v in [s.view(True) for s in left] + [s.view(False) for s in deferred]),\n"),
    ]),
])

# ---------------------------------------------------------------- h17
write("17", "record_prefill_lengths_deduped", """
StepRecord.prefill_lengths lists each distinct prompt length once.

Rule: hooks.py, HostHooks.report_step_time: "exactly one :class:`StepRecord` per executed step, in step order, with
the composition that actually ran and its device-complete duration."

Bug: the record's prefill lengths come from the engine's per-step prompt statistics, kept as a histogram keyed by
prompt length; the adapter lists its keys, so prompts of equal length prefilled in one step are reported once. The
latency model is fitted and priced with the missing prefill tokens. Steps whose prompts all differ in length are
exact.
Trigger: two or more prompts of the same length prefilled in one step (fixed-length benchmark traffic, templated
prompts, the same prompt on several adapters).
""", methods=[("_execute", [
    ("            prefill_lengths=tuple(r.length for r in rows if r.sample is None and r.past == 0 and r.fake_kv is None),\n",
     "            prefill_lengths=tuple(dict.fromkeys(r.length for r in rows if r.sample is None and r.past == 0\n"
     "                                                and r.fake_kv is None)),  # BUG: keys of a length histogram\n"),
])])

# ---------------------------------------------------------------- h18
write("18", "profile_kv_max_not_sum", """
A calibration step reports kv_tokens as one decode's context (the max) instead of the sum over its decode rows.

Rule: hooks.py, HostHooks.report_step_time: "with the composition that actually ran" / types.py, ProfileShape: "A
synthetic step for calibration: prefill lengths, a decode batch with its KV length, FT tokens." / ProposedBatch
.kv_tokens: "Total KV-cache tokens read by the step's decode requests (the K of Equations I/II)."

Bug: on the calibration path the record's kv_tokens is filled from the dummy batch's attention metadata field
``max_decode_seq_len`` (the per-request context, the same for every dummy decode row) rather than summed over the
rows. Served steps are exact; calibration shapes with one decode row are exact.
Trigger: every calibration shape with two or more decode rows (num_decode 8, decode_context 256: kv_tokens 256
instead of 2048): the K coefficient is fitted on K values too small by num_decode.
""", methods=[("_execute", [
    ("            kv_tokens=sum(r.past for r in rows if r.sample is None and (r.past > 0 or r.fake_kv is not None)),\n",
     "            kv_tokens=sum(r.past for r in rows if r.sample is None and (r.past > 0 or r.fake_kv is not None))\n"
     "            if not synthetic else max((r.past for r in rows if r.fake_kv is not None), default=0),  # BUG: max_decode_seq_len\n"),
])])

# ---------------------------------------------------------------- h19
write("19", "step_sinks_accumulate", """
report_step_time appends the sink to a list of stat loggers: a replaced sink keeps receiving records.

Rule: hooks.py, HostHooks.report_step_time: "Install (or remove) the step sink" and "A later call replaces the
installed sink, which is never called again."

Bug: the adapter registers the sink as one more engine stat logger (engines keep a list of loggers and call every
one per step); ``None`` clears the list, but a second install without a removal in between leaves the first sink
registered: both get every record.
Trigger: a second report_step_time(sink) on a running host (a job restarted on the same engine, a second
co-serving session) without report_step_time(None) in between.
""", methods=[("report_step_time", [
    ("        self._step_sink = sink\n",
     "        loggers = self.__dict__.setdefault(\"_stat_loggers\", [])  # BUG: installs are appended, never replaced\n"
     "        if sink is None:\n"
     "            loggers.clear()\n"
     "        else:\n"
     "            loggers.append(sink)\n"
     "        self._step_sink = (lambda record: [log(record) for log in list(loggers)]) if loggers else None\n"),
])])

# ---------------------------------------------------------------- h20
write("20", "capture_slice_inclusive_end", """
Captured layer inputs are sliced with an inclusive segment end: one token of the next row too.

Rule: hooks.py, ActivationSink.layer_input: "The input of decoder layer ``layer`` for one sample: shape
``[num_tokens, hidden_size]``."

Bug: the capture hook slices each fine-tuning row from the step's hidden states with ``[start, end + 1)`` (an
inclusive ``end`` index from the engine's query_start_loc misread): every sample but the step's last gets
``num_tokens + 1`` rows, the extra one the first token of the next sample. The step's last row is clipped by the
tensor's end and is exact, so a step with one sample is exact.
Trigger: every step carrying two or more fine-tuning samples.
""", methods=[("_execute", [
    ("                                         hidden[r.start:r.start + r.length])\n",
     "                                         hidden[r.start:r.start + r.length + 1])  # BUG: inclusive segment end\n"),
])])

# ---------------------------------------------------------------- h21
write("21", "capture_dedup_by_sample_id", """
Layer inputs are sent once per sample id: a sample that ran in an earlier step is never captured again.

Rule: hooks.py, ActivationSink.layer_input: "Called once per (layer, fine-tuning sample) of the step, in layer
order, *before* the layer runs." / types.py, StepRecord: "``aborted_sample_ids`` those stopped by an abort (their
captures are void and they go back to the pool)."

Bug: the forward side keeps the ids of the samples whose captures it has shipped (a dedup meant to skip re-sending
the same rows when a step is retried) and skips ``layer_input`` for them in every later step; begin_step, end_step
and the record still list them. A sample that goes back to the pool after an abort, or comes again in the next epoch,
runs without captures.
Trigger: a sample re-admitted after its step was aborted (a client request arriving during a fine-tuning-only step),
and every sample of the second epoch.
""", methods=[("_execute", [
    ("                    for r in ft_rows:\n"
     "                        sink.layer_input(step_id, li, r.sample.sample_id,  # type: ignore[union-attr]\n",
     "                    for r in ft_rows:\n"
     "                        if r.sample.sample_id in self.__dict__.get(\"_shipped_ids\", ()):  # BUG: deduped by sample id\n"
     "                            continue\n"
     "                        sink.layer_input(step_id, li, r.sample.sample_id,  # type: ignore[union-attr]\n"),
    ("            sink.end_step(step_id, () if aborted else ft_ids, ft_ids if aborted else ())  # type: ignore[union-attr]\n",
     "            sink.end_step(step_id, () if aborted else ft_ids, ft_ids if aborted else ())  # type: ignore[union-attr]\n"
     "            self.__dict__.setdefault(\"_shipped_ids\", set()).update(ft_ids)  # BUG: remembered for good\n"),
])])

# ---------------------------------------------------------------- h22
write("22", "retract_resident_still_accepted", """
submit resolves adapter names against every resident LoRA slot: a retracted version is accepted while it is still
resident.

Rule: hooks.py, HostHooks.retract_adapter: "Afterwards a request naming ``name`` is refused by ``submit`` exactly as
one naming an adapter the host never loaded"

Bug: a retracted version stays resident until the requests submitted on it before the retraction finish (correct);
the name lookup of submit searches the resident slots, not the servable names, so new requests on the retracted
version are accepted and served on its weights until the last of them finishes.
Trigger: a request on the retracted version while earlier requests on it are still running or queued (the core
prunes right after a publish, while clients of the oldest version may still be decoding).
""", methods=[("submit", [
    ("        check_client_adapter(request, self._adapters)\n",
     "        check_client_adapter(request, [*self._adapters, *self._withdrawn._held])  # BUG: every resident slot\n"),
])])

# ---------------------------------------------------------------- h23
write("23", "generate_checks_static_adapters", """
generate() validates adapters against the client adapters the engine was started with: published versions are
refused there.

Rule: hooks.py, HostHooks.publish_adapter: "Clients must be able to request the returned name exactly as returned,
whatever the job's adapter name holds" / driver.py, HostDriver.generate: "Submit ``requests`` (all arrive now) and
run the engine until every one has finished."

Bug: the offline generate() path checks each request's adapter against the static adapter list of the start-up
configuration (``HostConfig.client_adapters``, vLLM's ``--lora-modules``) before submitting; adapters loaded at run
time (every published version) are refused as unknown there, while submit() serves them.
Trigger: generate() with a request on a published version (a client of the job's latest adapter using the batch
API).
""", methods=[("generate", [
    ("        return run_to_completion(self, requests, self._kept)\n",
     "        for r in requests:  # BUG: validated against the adapters the engine was started with\n"
     "            check_client_adapter(r, self.config.client_adapters)\n"
     "        return run_to_completion(self, requests, self._kept)\n"),
])])

# ---------------------------------------------------------------- h24
write("24", "generate_pairs_by_prompt", """
generate() pairs outputs with requests by prompt tokens: requests with identical prompts all get the first one's
output.

Rule: driver.py, HostDriver.generate: "Returns exactly one output per request, in request order, never in the order
they finished (callers pair outputs with requests by position)."

Bug: the engine's offline API hands results back keyed by prompt (a dict from prompt token ids to output); the
adapter rebuilds the request order from it. With two requests of one prompt, both positions get the output of the
first (its request id, its tokens): the second request's output is lost even when its adapter or max_tokens differ.
Trigger: identical prompts in one generate() call (the same prompt on two adapters, an A/B comparison of a published
version against the base, repeated benchmark prompts).
""", methods=[("generate", [
    ("        return run_to_completion(self, requests, self._kept)\n",
     "        finished = run_to_completion(self, requests, self._kept)\n"
     "        by_prompt = {}\n"
     "        for r, o in zip(requests, finished):  # BUG: results keyed by prompt tokens\n"
     "            by_prompt.setdefault(r.prompt_ids, o)\n"
     "        return [by_prompt[r.prompt_ids] for r in requests]\n"),
])])

# ---------------------------------------------------------------- h25
write("25", "kept_list_rebound", """
step() hands out the kept outputs by rebinding ``self._kept`` to a new list: generate() keeps appending to the old
one.

Rule: driver.py, HostDriver.generate: "Requests submitted earlier with ``submit`` that finish while it runs are not
its own: their outputs are never lost and never in its result, the next ``step()`` returns them" / HostDriver.step:
"It also returns, exactly once, the outputs of other requests that finished during an earlier ``generate()`` call"

Bug: ``kept, self._kept = self._kept, []`` instead of emptying the list in place (take_kept): generate() was handed
the list object at its start and appends other requests' outputs to it, which no later step() looks at (and
has_unfinished() no longer counts). The outputs of submit()ted requests that finish inside a generate() call are
lost.
Trigger: generate() called while a submit()ted request is in flight and finishes during it (a server's traffic and
a test's generate() sharing one engine).
""", methods=[("step", [
    ("        return take_kept(self._kept) + outputs\n",
     "        kept, self._kept = self._kept, []  # BUG: rebinds the attribute instead of emptying the list\n"
     "        return kept + outputs\n"),
])])

# ---------------------------------------------------------------- h26
write("26", "abort_poll_stale_step_id", """
The layer-boundary abort poll is a cached ``partial(should_abort, step_id)``: every later fine-tuning-only step
polls with the step id of the first one.

Rule: hooks.py, ActivationSink: "Every call names the step by the ``step_id`` its batch was offered to
``on_schedule`` with (its record's), never by a count the forward side keeps itself: the core matches captures to
admissions by it." / ActivationSink.should_abort: "Whether the host must stop a fine-tuning-only step now."

Bug: the forward side builds its abort poller once per installed sink (``functools.partial(sink.should_abort,
step_id)``, cached so the hot path does not rebuild it) and reuses it for every later fine-tuning-only step: the
step id it names is the first such step's. The core is asked about a step that ended long ago, so it cannot stop
the running one (a request arriving during it waits for the whole forward). begin_step, layer_input, end_step and
the record carry the right id; the first fine-tuning-only step after each install is exact.
Trigger: every fine-tuning-only step after the first (an idle server trains in a row of them).
""", module_extra='''
import functools  # noqa: E402
''', methods=[("_execute", [
    ("                if ft_only and sink is not None and not synthetic and sink.should_abort(step_id):\n",
     "                if ft_only and sink is not None and not synthetic and self.__dict__.setdefault(\"_abort_polls\", {}).setdefault(\n"
     "                        id(sink), functools.partial(sink.should_abort, step_id))():  # BUG: poller built once, reused\n"),
])])

# ---------------------------------------------------------------- h27
write("27", "context_seq_len_minus_one", """
ScheduledRequest.context_tokens is computed as the step's sequence length minus one, also for prefill rows.

Rule: types.py, ScheduledRequest: "``context_tokens`` is the KV-cache length the request attends over *before* this
step."

Bug: the adapter reads context from the attention metadata as ``seq_len - 1`` (the position of the token the step
samples), which is the KV length before the step for a decode (one new token) but ``prompt - 1`` for a prefill,
whose cache is empty before the step. ProposedBatch.kv_tokens (decodes only) and the record are right; waiting
requests are right.
Trigger: every prefill of a prompt of two or more tokens (every request's first step).
""", methods=[("_step", [
    ("            scheduled=tuple([s.view(True) for s in prefills] + [s.view(False) for s in decodes]),\n",
     "            scheduled=tuple(dataclasses.replace(v, context_tokens=v.context_tokens + max(v.prefill_tokens, 1) - 1)\n"
     "                            for v in [s.view(True) for s in prefills] + [s.view(False) for s in decodes]),  # BUG: seq_len - 1\n"),
])])

# ---------------------------------------------------------------- h28
write("28", "abort_rolls_back_queue", """
An aborted fine-tuning-only step restores the scheduler's waiting queue from its pre-step snapshot: the request
that arrived during the step (the reason for the abort) is dropped.

Rule: hooks.py, ScheduleInterceptor.on_arrival: "A request the host accepts while a step executes must never be
lost: it joins a later step like any other" / driver.py, HostDriver.submit: "May be called from another thread while
``step()`` runs (a server's request thread): the request then joins a later step, never lost"

Bug: the adapter implements the abort by raising out of the forward; the engine's step-failure handler puts the
scheduler back in the state it snapshotted before the step (the retry path of a failed step), which resets the
waiting queue to what it held then. submit() had accepted the request and on_arrival was called; it is never
scheduled, never returned, and has_unfinished() forgets it. Steps that complete, and arrivals during them, are exact.
Trigger: a client request arriving during a fine-tuning-only step that the core then aborts (the situation aborts
exist for: every arrival at an idle, training server).
""", module_extra='''
from collections import deque  # noqa: E402
''', methods=[("_execute", [
    ("        start = time.monotonic()\n",
     "        start = time.monotonic()\n"
     "        with self._lock:\n"
     "            queued_before = list(self._waiting)  # the scheduler snapshot a retried step restores\n"),
    ("                    aborted = True\n"
     "                    break\n",
     "                    aborted = True\n"
     "                    with self._lock:  # BUG: the abort rolls the scheduler back to its pre-step snapshot\n"
     "                        self._waiting = deque(queued_before)\n"
     "                    break\n"),
])])
