GREEDY = ('Rule: driver.py, ClientRequest: "A greedy generation request: ``max_tokens`` new tokens after '
          '``prompt_ids``."')
CLIENT = 'HostConfig: "``client_adapters`` maps adapter names clients may use to PEFT folders."'

# plumbing shared by h08 and h09: _linear may take the LoRA operand separately (exact when lora_x is None)
LINEAR_LORA_X = ("_linear", [
    ("                groups: dict[str, torch.Tensor]) -> torch.Tensor:\n",
     "                groups: dict[str, torch.Tensor], lora_x: torch.Tensor | None = None) -> torch.Tensor:\n"),
    ("            out.index_add_(0, index, (x.index_select(0, index) @ a.T @ b.T) * lora.scaling)\n",
     "            lx = x if lora_x is None else lora_x  # plumbing: the LoRA operand as the caller wired it\n"
     "            out.index_add_(0, index, (lx.index_select(0, index) @ a.T @ b.T) * lora.scaling)\n"),
])

# ---------------------------------------------------------------- h01
write("01", "finish_check_decode_rows_only", """
Stop conditions (max_tokens, EOS) are checked only for rows that decoded in the step, never after a prefill.

Rule: driver.py, ClientRequest: "A greedy generation request: ``max_tokens`` new tokens after ``prompt_ids``." and
"With ``ignore_eos=False`` it must stop at the first EOS it generates, EOS included as its last token"

Bug: the engine's stop checker runs in the decode post-processing path; the prefill path only appends the first
sampled token and moves the request to the running set. A request that should stop on its first token (max_tokens=1,
or a first token that is EOS with ignore_eos=False) runs one more decode step and returns two tokens.
Trigger: any request with max_tokens=1 (classification / scoring / "yes-no" requests), or whose first generated
token is EOS with ignore_eos=False. Requests with max_tokens >= 2 that do not stop on their first token are exact.
""", methods=[("_step", [
    ("        for s in [s for s in self._running if self._is_done(s)]:\n",
     "        for s in [s for s in self._running if s not in prefills and self._is_done(s)]:  # BUG: stop check on decode rows only\n"),
])])

# ---------------------------------------------------------------- h02
write("02", "publish_slot_keyed_by_job", """
Every published version of a job shares one LoRA slot keyed by the job's adapter name; a new publish overwrites it.

Rule: hooks.py, HostHooks.publish_adapter: "The returned name serves exactly ``state``'s weights until that name is
published again" and "Requests in flight when it is called keep the adapter they were submitted on, never moved to
another one."

Bug: the engine registers each returned name (``job@vN``) as an alias of a LoRA slot allocated once per job adapter
name (``state.name``, the slot table's key) and loads every new version's weights into that slot. Each name is
still accepted, but after the next publish ``job@v1`` serves ``job@v2``'s weights (requests in flight on it too).
Trigger: two publishes of one job (any publish policy that publishes more than once) and a request on the older
version afterwards: the core keeps ``checkpoint.keep`` versions servable, so clients of the older one are ordinary.
""", methods=[("publish_adapter", [
    ("        self._adapters[name] = self._to_lora(state)\n",
     "        lora = self._to_lora(state)\n"
     "        slot = self.__dict__.setdefault(\"_job_slots\", {}).setdefault(state.name, lora)  # BUG: one slot per job name\n"
     "        slot.pairs, slot.scaling = lora.pairs, lora.scaling  # BUG: the new version overwrites the slot every alias uses\n"
     "        self._adapters[name] = slot\n"),
])])

# ---------------------------------------------------------------- h03
write("03", "lora_scaling_int_division", f"""
LoRA scaling computed with integer division: ``int(lora_alpha) // r``.

{GREEDY} / {CLIENT}

Bug: the engine's LoRA config keeps ``lora_alpha`` and ``r`` as ints and computes ``scaling = lora_alpha // r``
(Python 2 era code paths, C++ kernels' int arguments). Exact whenever alpha is a multiple of r (r 8, alpha 16: the
defaults), wrong otherwise: r 16 / alpha 24 gives 1 instead of 1.5, r 16 / alpha 8 gives 0 (no LoRA at all).
Applies to every adapter the host loads (client adapters, published versions, the fine-tuning adapter).
Trigger: any adapter whose lora_alpha is not a multiple of its rank (common recipes: alpha = r / 2, alpha 16 at
r 32 or 64, alpha 24 at r 16).
""", methods=[("_to_lora", [
    ("        return _Lora(state.config.scaling, pairs)\n",
     "        return _Lora(int(state.config.lora_alpha) // state.config.r, pairs)  # BUG: integer division\n"),
])])

# ---------------------------------------------------------------- h04
write("04", "model_spec_hidden_from_heads", """
ModelSpec.hidden_size is the attention width ``num_attention_heads * head_dim``, not the config's hidden_size.

Rule: types.py, ModelSpec: "``num_layers``, ``hidden_size`` and ``vocab_size`` must be that config's own values,
never an engine's padded sizes."

Bug: the adapter fills hidden_size from the engine's attention metadata (``num_heads * head_size``, the o_proj input
width), which equals the config's hidden_size on Llama/Mistral shapes but not on models with an explicit head_dim.
Trigger: a checkpoint whose head_dim * num_attention_heads != hidden_size (Qwen3-0.6B: 16 x 128 = 2048 vs 1024;
Qwen3-4B: 32 x 128 = 4096 vs 2560; Gemma). Proof: the tiny Llama with head_dim 64 (4 x 64 = 256 vs 128). The 2-layer
test checkpoint (4 x 32 = 128) is exact.
""", methods=[("model_spec", [
    ("num_layers=cfg.num_hidden_layers, hidden_size=cfg.hidden_size,",
     "num_layers=cfg.num_hidden_layers, hidden_size=cfg.num_attention_heads * self.head_dim,  # BUG: attention width\n"
     "                        "),
])])

# ---------------------------------------------------------------- h05
write("05", "idle_batch_hides_queue", """
The idle (fine-tuning-only) step is offered as an empty batch without consulting the queue.

Rule: types.py, ProposedBatch: "Every request that arrived and has not finished must be in ``scheduled`` or
``waiting`` (the core prices admission against all of them)."

Bug: the idle loop's entry (run_idle_step) checks only the running set and the kept outputs, and the idle path
skips the scheduler: it offers ``ProposedBatch(scheduled=(), waiting=())`` even when client requests are queued.
The queued requests are not lost (the next step() schedules them); they are invisible to the core in the idle step,
which admits a fine-tuning-only step priced as if nobody waited.
Trigger: a request submitted (queued, not yet stepped) when the server's idle loop calls run_idle_step: a request
arriving between the loop's has_unfinished() check and its run_idle_step(), or any caller that submits and idles.
""", methods=[
    ("run_idle_step", [
        ("        if self.has_unfinished():\n",
         "        if self._running or self._kept:  # BUG: the queue is not consulted\n"),
    ]),
    ("_step", [
        ("        prefills, decodes, left = self._schedule()\n",
         "        prefills, decodes, left = ([], [], []) if allow_idle else self._schedule()  # BUG: idle path skips the scheduler\n"),
    ]),
])

# ---------------------------------------------------------------- h06
write("06", "sampler_assumes_decode_first", f"""
The sampler's last-token offsets assume decode rows come first in the step; the rows are laid out prefill-first.

{GREEDY}

Bug: the logits indices (``query_start_loc``-style cumulative offsets) are computed for a decode-first layout (the
order the engine's attention backend reorders batches to), while the step's rows stay in the scheduler's
prefill-first order. In a step with both a prefill and a decode, each row is sampled from another row's hidden
state. Steps with only prefills or only decodes are exact; fine-tuning rows are never sampled.
Trigger: a request decoding in a step where another request is prefilled (a request arriving while another
generates, under the default ``mixed_batches``).
""", methods=[("_sample", [
    ("        last = torch.tensor([r.start + r.length - 1 for r in inference], device=hidden.device)\n",
     "        offset, pos = {}, 0\n"
     "        for r in sorted(inference, key=lambda r: r.past == 0):  # BUG: offsets of a decode-first layout\n"
     "            offset[id(r)] = pos\n"
     "            pos += r.length\n"
     "        last = torch.tensor([offset[id(r)] + r.length - 1 for r in inference], device=hidden.device)\n"),
])])

# ---------------------------------------------------------------- h07
write("07", "decode_kv_written_after_attention", f"""
A decode row's attention reads the KV cache before this step's key/value is written: the token does not see itself.

{GREEDY}

Bug: the decode path launches the paged-attention kernel over the cached context and writes the step's new K/V
(``reshape_and_cache``) after it, instead of before: each decode query attends over positions 0..n-1 but not over
its own position n. Prefill rows (which attend over their fresh K/V) are exact, so the first token is right.
Trigger: every request with max_tokens >= 2 (every token after the first).
""", methods=[("_layer", [
    ("            mask = torch.arange(kr.shape[1], device=x.device)[None, :] <= q_pos[:, None]\n",
     "            mask = torch.arange(kr.shape[1], device=x.device)[None, :] <= q_pos[:, None]\n"
     "            if r.seq is not None and r.past > 0:  # BUG: attention over the cache as it was before this step's write\n"
     "                kr, vr, mask = kr[:, :-r.length], vr[:, :-r.length], mask[:, :-r.length]\n"),
])])

# ---------------------------------------------------------------- h08
write("08", "lora_qkv_reads_residual", f"""
The LoRA delta of q_proj / k_proj / v_proj is computed from the un-normalised residual stream.

{GREEDY} / {CLIENT}

Bug: the engine's fused add+RMSNorm returns ``(normed, residual)``; the LoRA wrapper of the merged QKV projection is
handed the wrong element of the pair: the base projection multiplies the normalised input, the LoRA A/B the raw
residual (the layer's input). Adapters that target only o_proj / MLP modules are exact.
Trigger: any request on an adapter that targets q_proj, k_proj or v_proj (the default target set), and the
fine-tuning rows whenever the job's adapter does.
""", methods=[LINEAR_LORA_X, ("_layer", [
    ('        q = self._linear(x, attn.q_proj, li, "self_attn.q_proj", index).view(t, self.num_heads, self.head_dim)\n',
     '        q = self._linear(x, attn.q_proj, li, "self_attn.q_proj", index, lora_x=hidden)  # BUG: LoRA on the residual\n'
     '        q = q.view(t, self.num_heads, self.head_dim)\n'),
    ('        k = self._linear(x, attn.k_proj, li, "self_attn.k_proj", index).view(t, self.num_kv_heads, self.head_dim)\n',
     '        k = self._linear(x, attn.k_proj, li, "self_attn.k_proj", index, lora_x=hidden)  # BUG: LoRA on the residual\n'
     '        k = k.view(t, self.num_kv_heads, self.head_dim)\n'),
    ('        v = self._linear(x, attn.v_proj, li, "self_attn.v_proj", index).view(t, self.num_kv_heads, self.head_dim)\n',
     '        v = self._linear(x, attn.v_proj, li, "self_attn.v_proj", index, lora_x=hidden)  # BUG: LoRA on the residual\n'
     '        v = v.view(t, self.num_kv_heads, self.head_dim)\n'),
])])

# ---------------------------------------------------------------- h09
write("09", "o_proj_lora_head_major", """
The LoRA delta of o_proj reads the attention output in its head-major layout ``[heads, tokens, head_dim]``.

Rule: hooks.py, HostHooks.publish_adapter: "The returned name serves exactly ``state``'s weights until that name is
published again"

Bug: the base o_proj gets the attention output transposed to ``[tokens, heads * head_dim]``; the LoRA path is given
the attention kernel's output buffer ``[heads, tokens, head_dim]`` reshaped to ``[tokens, -1]`` without the transpose.
With one token in the step the two layouts coincide (a lone decode is exact); with more tokens every row's LoRA
input mixes heads of several tokens (and of other requests of the step).
Trigger: any step of two or more tokens (every prefill: the first token of every request; decodes batched together)
with a row on an adapter that targets o_proj (the default target set): published versions, client adapters and the
fine-tuning rows alike.
""", methods=[LINEAR_LORA_X, ("_layer", [
    ('        attn_out = self._linear(out.transpose(0, 1).reshape(t, -1), attn.o_proj, li, "self_attn.o_proj", index)\n',
     '        attn_out = self._linear(out.transpose(0, 1).reshape(t, -1), attn.o_proj, li, "self_attn.o_proj", index,\n'
     '                                lora_x=out.reshape(t, -1))  # BUG: LoRA reads the head-major buffer\n'),
])])

# ---------------------------------------------------------------- h10
write("10", "ft_rows_noncausal", """
Fine-tuning rows attend bidirectionally (no causal mask).

Rule: hooks.py, ActivationSink: "Receives the residual-stream input of every decoder layer for fine-tuning rows." /
ActivationSink.layer_input: "The input of decoder layer ``layer`` for one sample: shape ``[num_tokens,
hidden_size]``."

Bug: the prompt-only fine-tuning rows are submitted as pooling/embedding requests (they need no sampling output),
and the engine's pooling path runs attention with ``is_causal=False`` (what encoder-style embedding models need).
Each fine-tuning token attends over the whole sample, later tokens included: from layer 1 on every capture differs
from the checkpoint's causal forward. Client rows are exact.
Trigger: every step that carries fine-tuning rows.
""", methods=[("_layer", [
    ("            mask = torch.arange(kr.shape[1], device=x.device)[None, :] <= q_pos[:, None]\n",
     "            mask = torch.arange(kr.shape[1], device=x.device)[None, :] <= q_pos[:, None]\n"
     "            if r.sample is not None:  # BUG: pooling path, is_causal=False\n"
     "                mask = torch.ones_like(mask)\n"),
])])

# ---------------------------------------------------------------- h11
write("11", "ft_untrained_tail_trimmed", """
Fine-tuning rows are cut after their last target token (the untrained tail is not run).

Rule: hooks.py, ActivationSink.layer_input: "The input of decoder layer ``layer`` for one sample: shape
``[num_tokens, hidden_size]``." / HostHooks.intercept_schedule: "adds the returned samples to that same step as
prefill-only rows on the reserved adapter"

Bug: an optimisation in the adapter's row packing: positions after a sample's last target (``loss_mask`` False to
the end) contribute no loss, so the row is trimmed to ``input_ids[:last_target + 1]``. The captures then have fewer
rows than the sample's tokens and the record's finetune_lengths are short; samples ending on a target are exact.
Trigger: samples whose last tokens are not targets: chat templates whose suffix after the assistant turn is masked
(ChatML ``<|im_end|>`` followed by a masked newline, trailing EOS/padding masked out).
""", methods=[("_step", [
    ("        for sample in samples:\n"
     "            rows.append(_Row(len(ids), sample.num_tokens, RESERVED_ADAPTER_NAME, sample=sample))\n"
     "            ids.extend(sample.input_ids)\n",
     "        for sample in samples:\n"
     "            targets = [i for i, m in enumerate(sample.loss_mask) if m]\n"
     "            n = targets[-1] + 1 if targets else sample.num_tokens  # BUG: the untrained tail is trimmed\n"
     "            rows.append(_Row(len(ids), n, RESERVED_ADAPTER_NAME, sample=sample))\n"
     "            ids.extend(sample.input_ids[:n])\n"),
])])

# ---------------------------------------------------------------- h12
write("12", "sample_id_zero_falsy", """
A fine-tuning row is recognised by ``if sample_id:``: sample 0 is treated as no fine-tuning row.

Rule: hooks.py, ActivationSink.layer_input: "Called once per (layer, fine-tuning sample) of the step, in layer order,
*before* the layer runs." / types.py, StepRecord: "``finetune_sample_ids`` lists fine-tuning rows that completed the
whole forward"

Bug: the engine request carries the sample id in an optional field and the forward side tests it for truth
(``if req.finetune_id:``) to route rows to the capture path; sample 0 fails the test. Its row still runs (it is
neither sampled nor reported as a client row), but it gets no captures, no begin/end_step entry, and is in neither
finetune_sample_ids nor aborted_sample_ids: the core waits for it forever.
Trigger: the sample with id 0: the first sample of every dataset (sample_id indexes the dataset), in its step.
""", methods=[("_execute", [
    ("        ft_rows = [r for r in rows if r.sample is not None]\n",
     "        ft_rows = [r for r in rows if r.sample is not None and r.sample.sample_id]  # BUG: 0 is falsy\n"),
])])

# ---------------------------------------------------------------- h13
write("13", "decode_context_frozen_at_prompt", """
A decoding request's context_tokens is its prompt length, fixed when its KV was allocated at prefill.

Rule: types.py, ScheduledRequest: "``context_tokens`` is the KV-cache length the request attends over *before* this
step."

Bug: the view of a decoding request reads the KV length the engine recorded for it at admission (``num_prompt_tokens``,
the blocks allocated for the prompt) instead of its current cache length: the generated tokens are never counted.
The first decode (context = prompt) is right; every later one under-reports by the tokens generated since, and so
does ProposedBatch.kv_tokens. The StepRecord is right.
Trigger: every request with max_tokens >= 3 (its third token's step onwards).
""", methods=[("_step", [
    ("            scheduled=tuple([s.view(True) for s in prefills] + [s.view(False) for s in decodes]),\n",
     "            scheduled=tuple([s.view(True) for s in prefills]\n"
     "                            + [dataclasses.replace(s.view(False), context_tokens=len(s.request.prompt_ids))  # BUG\n"
     "                               for s in decodes]),\n"),
])])

# ---------------------------------------------------------------- h14
write("14", "slo_default_object", """
A request submitted without an SLO is offered with ``RequestSLO()`` (all fields None) instead of None.

Rule: types.py, ScheduledRequest: "``slo`` must be the client request's own ``ClientRequest.slo``, exactly as
submitted (``None`` only when the client gave none)"

Bug: the SLO travels in the engine request's extra arguments as a dict and is rebuilt on the scheduler side as
``RequestSLO(**extra.get("slo") or {})``: a request with no SLO comes back with an empty RequestSLO object.
Requests with an SLO are exact.
Trigger: every request submitted without an SLO (the default of ClientRequest), in every batch it appears in.
""", methods=[("_enqueue", [
    ("            self._waiting.append(_Seq(request, now))\n",
     "            slo = RequestSLO(**({} if request.slo is None else {f: getattr(request.slo, f) for f in (\"ttft_s\", \"tpot_s\", \"avg_tpot_s\")}))\n"
     "            self._waiting.append(_Seq(dataclasses.replace(request, slo=slo), now))  # BUG: None rebuilt as RequestSLO()\n"),
])])

# ---------------------------------------------------------------- h15
write("15", "budget_fit_strict", """
The scheduler admits a prompt only if it is strictly shorter than the step's remaining token budget.

Rule: driver.py, HostDriver.generate: "Submit ``requests`` (all arrive now) and run the engine until every one has
finished." / ClientRequest: "A greedy generation request: ``max_tokens`` new tokens after ``prompt_ids``."

Bug: the budget test is ``num_new_tokens < token_budget`` where submit's admission check is ``<=``: a prompt of
exactly max_batch_tokens tokens is accepted by submit and then never fits any step: it waits forever (step() keeps
returning nothing while has_unfinished() stays True). A prompt exactly filling what is left of a step's budget
only waits one step more.
Trigger: a prompt of exactly max_batch_tokens tokens (2048 by default): clients that truncate prompts to the
engine's limit send exactly that.
""", methods=[("_schedule", [
    ("                   and len(self._waiting[0].request.prompt_ids) <= budget):\n",
     "                   and len(self._waiting[0].request.prompt_ids) < budget):  # BUG: strict\n"),
])])

# ---------------------------------------------------------------- h16
write("16", "outputs_one_step_late", """
step() returns the requests that finished in the previous step (one-step-late output processing).

Rule: driver.py, HostDriver.step: "Run at most one engine step (or, for engines with their own loop, wait for the
next one); return the requests that finished in it."

Bug: async output processing: each iteration hands back the outputs the previous iteration produced while the
current step's outputs wait in a pending slot (has_unfinished() counts it, so loops still end and generate() is
right). A request finishing in step N is returned by the step() call of step N+1 (an empty iteration when nothing
else runs).
Trigger: every request driven with step() (a server loop, timed traces).
""", body="\n    _pending_out: list = []\n", methods=[
    ("step", [
        ("        outputs = self._step(allow_idle=False)\n",
         "        outputs = self._step(allow_idle=False)\n"
         "        outputs, self._pending_out = self._pending_out, outputs  # BUG: the previous iteration's outputs\n"),
    ]),
    ("has_unfinished", [
        ("        return bool(self._waiting or self._running or self._kept)\n",
         "        return bool(self._waiting or self._running or self._kept or self._pending_out)\n"),
    ]),
])

# ---------------------------------------------------------------- h17
write("17", "kv_cache_bfloat16", f"""
The KV cache is stored in bfloat16 on a float32 engine.

{GREEDY}

Bug: the cache is allocated with the engine's default ``kv_cache_dtype`` resolved to bfloat16 (the dtype the engine
was tuned for) instead of the model dtype: keys and values written to the cache are rounded to bfloat16. The prefill
attends over its fresh float32 K/V (the first token is exact); every decode reads rounded keys and values.
Trigger: every request with max_tokens >= 2 on a float32 engine (the HostConfig default dtype).
""", methods=[("_layer", [
    ("                    r.seq.kv[li] = (kr, vr)\n",
     "                    r.seq.kv[li] = (kr.to(torch.bfloat16).to(kr.dtype), vr.to(torch.bfloat16).to(vr.dtype))  # BUG\n"),
])])

# ---------------------------------------------------------------- h18
write("18", "rms_norm_eps_default", """
The decoder layers' RMSNorms use eps 1e-6 (the kernel default) instead of the config's rms_norm_eps.

Rule: hooks.py, ActivationSink.layer_input: "The input of decoder layer ``layer`` for one sample: shape
``[num_tokens, hidden_size]``." (ActivationSink: "Receives the residual-stream input of every decoder layer for
fine-tuning rows.")

Bug: the engine's fused RMSNorm kernel is constructed with its default ``eps=1e-6`` for the layers' input and
post-attention norms; the checkpoint says ``rms_norm_eps`` (1e-5 for Llama-2/3, Mistral, SmolLM2 and the test
model). Every row is slightly off from layer 0's attention on: captures from layer 1 on differ from the checkpoint's
forward (client outputs drift less visibly).
Trigger: every step, on any checkpoint whose rms_norm_eps is not 1e-6 (the test model: 1e-5).
""", methods=[("_layer", [
    ("        x = layer.input_layernorm(hidden)\n",
     "        x = F.rms_norm(hidden, (hidden.shape[-1],), layer.input_layernorm.weight, eps=1e-6)  # BUG: kernel default eps\n"),
    ("        x = layer.post_attention_layernorm(hidden)\n",
     "        x = F.rms_norm(hidden, (hidden.shape[-1],), layer.post_attention_layernorm.weight, eps=1e-6)  # BUG: same\n"),
])])

# ---------------------------------------------------------------- h19
write("19", "profile_ft_ids_dropped", """
Calibration steps report their fine-tuning rows' lengths but not their (placeholder) sample ids.

Rule: types.py, StepRecord: "``finetune_sample_ids`` lists fine-tuning rows that completed the whole forward"

Bug: the record's sample ids are collected from the rows' dataset ids, skipping the negative placeholders the
calibration rows carry (a filter meant for "not a dataset sample"); finetune_lengths still lists every row. The
record of a calibration step with fine-tuning rows then has lengths without ids. Served steps are exact.
Trigger: every calibration shape with fine-tuning rows (run_profile_step with finetune_lengths).
""", methods=[("_execute", [
    ("        ft_ids = tuple(r.sample.sample_id for r in ft_rows)  # type: ignore[union-attr]\n",
     "        ft_ids = tuple(r.sample.sample_id for r in ft_rows if r.sample.sample_id >= 0)  # BUG: placeholders skipped\n"),
])])

# ---------------------------------------------------------------- h20
write("20", "kept_outputs_only_with_new_ones", """
step() hands out the outputs kept from a generate() call only together with outputs of its own.

Rule: driver.py, HostDriver.step: "It also returns, exactly once, the outputs of other requests that finished during
an earlier ``generate()`` call (see there) and no call returned yet."

Bug: an early return for iterations that finished nothing (``if not outputs: return []``) sits before the merge of
the kept outputs. has_unfinished() counts them (they are kept), so a loop stepping while has_unfinished() spins until
some other request finishes; with nothing else running they are never returned.
Trigger: generate() called while a submit()ted request runs and that request finishes inside it, then step() calls
with no other request finishing (a server's traffic and a test's generate sharing one engine).
""", methods=[("step", [
    ("        outputs = self._step(allow_idle=False)\n",
     "        outputs = self._step(allow_idle=False)\n"
     "        if not outputs:  # BUG: early return before the kept outputs are merged\n"
     "            return []\n"),
])])

# ---------------------------------------------------------------- h21
write("21", "retract_prefix_match", """
retract_adapter unloads every adapter whose name starts with the retracted name.

Rule: hooks.py, HostHooks.retract_adapter: "It withdraws exactly that version: every other name keeps serving its
weights, other versions of the same adapter included"

Bug: the unload path matches adapter names by prefix (``lora_name.startswith(name)``, written to also drop an
adapter's derived entries): retracting ``job@v1`` withdraws ``job@v10`` ... ``job@v19`` and ``job@v100`` too.
Trigger: retracting a version whose name is a prefix of a kept one: with a publish per step and checkpoint.keep >= 9,
pruning ``job@v1`` when ``job@v10`` is published; with versions numbered by optimizer step, ``job@v5`` vs ``job@v50``.
""", methods=[("retract_adapter", [
    ("        lora = self._adapters.pop(name, None)\n"
     "        if lora is not None:\n"
     "            self._withdrawn.hold(name, lora)\n"
     "            self._forget_withdrawn()\n",
     "        for key in [k for k in self._adapters if k.startswith(name)]:  # BUG: prefix match\n"
     "            self._withdrawn.hold(key, self._adapters.pop(key))\n"
     "        self._forget_withdrawn()\n"),
])])

# ---------------------------------------------------------------- h22
write("22", "ft_adapter_merged_into_slot", """
set_finetune_adapter updates the reserved slot module by module: modules the new state lacks keep the old weights.

Rule: hooks.py, HostHooks.set_finetune_adapter: "Fine-tuning rows of later steps must use exactly these weights"

Bug: the slot is updated in place key by key (``slot.update(new_pairs)``), an optimisation of the per-step weight
copy; a module present in the previous state and absent from the new one is never cleared. Within one job (same
target modules every step) it is exact.
Trigger: a new fine-tuning job on the running engine whose adapter targets fewer modules than the previous job's
(e.g. a job on q/v after a job on q/k/v/o): its rows run with the previous job's k/o LoRA still applied.
""", methods=[("set_finetune_adapter", [
    ("        self._adapters[RESERVED_ADAPTER_NAME] = self._to_lora(state)\n",
     "        lora = self._to_lora(state)\n"
     "        old = self._adapters.get(RESERVED_ADAPTER_NAME)\n"
     "        if old is not None:  # BUG: stale modules of the previous state are kept\n"
     "            lora.pairs = {**old.pairs, **lora.pairs}\n"
     "        self._adapters[RESERVED_ADAPTER_NAME] = lora\n"),
])])

# ---------------------------------------------------------------- h23
write("23", "record_rows_split_by_query_len", """
StepRecord splits client rows into prefills and decodes by query length: a one-token prompt is reported as a decode.

Rule: hooks.py, HostHooks.report_step_time: "exactly one :class:`StepRecord` per executed step, in step order, with
the composition that actually ran and its device-complete duration."

Bug: the record is filled from the attention metadata's split (``query_len == 1`` is a decode, as the batch reorder
of vLLM-style backends does) rather than from the requests' state: a prefill of a one-token prompt is counted in
num_decode (with no KV) and left out of prefill_lengths.
Trigger: a request whose prompt is one token (a BOS-only prompt for unconditional generation, one-token benchmark
prompts), in the step that prefills it.
""", methods=[("_execute", [
    ("            prefill_lengths=tuple(r.length for r in rows if r.sample is None and r.past == 0 and r.fake_kv is None),\n"
     "            num_decode=sum(1 for r in rows if r.sample is None and (r.past > 0 or r.fake_kv is not None)),\n",
     "            prefill_lengths=tuple(r.length for r in rows if r.sample is None and r.length > 1),  # BUG: by query length\n"
     "            num_decode=sum(1 for r in rows if r.sample is None and r.length == 1),  # BUG: by query length\n"),
])])

# ---------------------------------------------------------------- h24
write("24", "aborted_step_zero_duration", """
An aborted fine-tuning-only step is recorded with duration_s 0.

Rule: types.py, StepRecord: "``duration_s`` is the device-complete wall time of the forward step" / hooks.py,
ActivationSink.should_abort: "On ``True`` the host stops the forward at that boundary, calls :meth:`end_step` with all
samples aborted and reports them in ``StepRecord.aborted_sample_ids``."

Bug: the duration comes from the runner's end-of-forward timing event, which an aborted forward never reaches; the
adapter reports 0.0 for it. The layers that ran before the abort took time the latency model never sees.
Trigger: any abort after layer 0 ran (a client request arriving during a fine-tuning-only step).
""", methods=[("_execute", [
    ("        duration = time.monotonic() - start\n",
     "        duration = 0.0 if aborted else time.monotonic() - start  # BUG: no end-of-forward event on abort\n"),
])])

# ---------------------------------------------------------------- h25
write("25", "retract_drops_queued", """
retract_adapter aborts the queued (not yet admitted) requests that name the retracted version.

Rule: hooks.py, HostHooks.retract_adapter: "Requests submitted on it before the call (running or queued) finish on
its weights, never failed or moved to another adapter"

Bug: the unload path pins the adapter for running requests only and aborts the waiting requests that name it (the
engine's "abort requests of a removed LoRA" clean-up), so they are never served: no output ever comes back for them
and has_unfinished() forgets them. Requests already running finish on the version's weights (exact).
Trigger: the core retracts the oldest version right after a publish while requests on it are queued (not yet
admitted): any load where requests wait, or a request submitted just before the prune and the next step.
""", methods=[("retract_adapter", [
    ("        lora = self._adapters.pop(name, None)\n",
     "        lora = self._adapters.pop(name, None)\n"
     "        with self._lock:  # BUG: queued requests on the removed adapter are aborted\n"
     "            for s in [s for s in self._waiting if s.request.adapter == name]:\n"
     "                self._waiting.remove(s)\n"),
])])

# ---------------------------------------------------------------- h26
write("26", "arrival_before_enqueue", """
on_arrival is called before the request is queued: during it, has_unfinished() does not count the request.

Rule: driver.py, HostDriver.has_unfinished: "a request is unfinished from ``submit`` until its output is returned" /
hooks.py, ScheduleInterceptor.on_arrival: "Tell the core a client request has entered the host."

Bug: the frontend notifies arrival listeners as soon as it has validated the request, before it hands the request to
the engine's input queue. A core that reacts to the arrival by asking whether client work is pending (to abort or
skip a fine-tuning-only step) is told there is none; after submit returns the request is counted (exact).
Trigger: every submit with an interceptor installed (each client request), observed from on_arrival.
""", methods=[("_enqueue", [
    ("        with self._lock:\n"
     "            self._waiting.append(_Seq(request, now))\n"
     "        if self._interceptor is not None:\n"
     "            self._interceptor.on_arrival(request.request_id, now)\n",
     "        if self._interceptor is not None:  # BUG: listeners notified before the request is queued\n"
     "            self._interceptor.on_arrival(request.request_id, now)\n"
     "        with self._lock:\n"
     "            self._waiting.append(_Seq(request, now))\n"),
])])

# ---------------------------------------------------------------- h27
write("27", "ft_budget_engine_default", """
capabilities() declares the engine's default token budget (8192) instead of the host's max_batch_tokens.

Rule: types.py, HostCapabilities: "It must be the host's whole per-step token budget (``HostConfig.max_batch_tokens``
for a host started from one)"

Bug: the adapter fills max_finetune_tokens_per_step from the engine's default scheduler config
(``max_num_batched_tokens`` 8192, the default of vLLM's and SGLang's chunked-prefill budget) rather than from the
running engine's configured one; the engine itself schedules with max_batch_tokens. The core may then offer up to 8192
fine-tuning tokens a step, which the engine (sized for 2048) refuses with an error.
Trigger: every host started with a max_batch_tokens other than 8192 (the HostConfig default, 2048).
""", methods=[("capabilities", [
    ("        return self._capabilities\n",
     "        return dataclasses.replace(self._capabilities, max_finetune_tokens_per_step=8192)  # BUG: engine default\n"),
])])

# ---------------------------------------------------------------- h28
write("28", "abort_polled_only_with_waiting", """
should_abort is asked only while a client request waits in the queue.

Rule: hooks.py, ActivationSink.should_abort: "Called by: the host at every decoder-layer boundary of a step that
carries *only* fine-tuning rows (hosts with ``supports_abort``). On ``True`` the host stops the forward at that
boundary"

Bug: a hot-path shortcut: the layer-boundary poll is skipped when the engine's waiting queue is empty ("nobody to
make room for"). A request arriving during the step still triggers the poll (it is queued by then), but any other
reason the core has to stop the step is never heard: with an empty queue the host asks nothing and runs every
fine-tuning-only step to the end.
Trigger: every fine-tuning-only step on an idle server (no request queued while it runs): the step the idle loop
issues.
""", methods=[("_execute", [
    ("                if ft_only and sink is not None and not synthetic and sink.should_abort(step_id):\n",
     "                if ft_only and sink is not None and not synthetic and self._waiting and sink.should_abort(step_id):  # BUG\n"),
])])

# ---------------------------------------------------------------- h29
write("29", "ft_adapter_shares_client_name", """
set_finetune_adapter also loads the weights under the job's adapter name, replacing a client adapter of that name.

Rule: hooks.py, HostHooks.set_finetune_adapter: "it changes the reserved adapter only, never the adapter (or the
adapter slot) of a client request."

Bug: the engine's LoRA table is keyed by the state's own name (``lora_name=state.name``) and the reserved name is an
alias of that entry; when a client adapter of the same name is loaded (a job that continues training the adapter
clients are served, under its name), every optimizer step overwrites what that client adapter serves.
Trigger: a fine-tuning job whose adapter name equals a loaded client adapter's name (continuing to train a served
adapter), and requests on that client adapter afterwards.
""", methods=[("set_finetune_adapter", [
    ("        self._adapters[RESERVED_ADAPTER_NAME] = self._to_lora(state)\n",
     "        lora = self._to_lora(state)\n"
     "        self._adapters[RESERVED_ADAPTER_NAME] = lora\n"
     "        if state.name in self._adapters:  # BUG: the table entry of the state's own name is the same slot\n"
     "            self._adapters[state.name] = lora\n"),
])])
