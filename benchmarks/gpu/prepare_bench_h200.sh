#!/usr/bin/env bash
# Here (CPU machine), before benchmarks/gpu/bench_h200.sh: assemble .whl/x (git-ignored, carried to the GPU machine,
# < 4 MiB) with what the GPU machine cannot fetch: a tokenizer for the Llama-3-8B-shaped model (the tiny model's
# byte-level BPE: the benchmark sends random token ids, so only the lengths of the fine-tuning data depend on it),
# ShareGPT prompt/output lengths counted in that tokenizer (the 125 MB ShareGPT file is too big to carry), the
# Alpaca demo fine-tuning set, and the Mooncake conversation trace (../shared/traces/mooncake; Apache-2.0, its licence
# beside it) without its hash_ids (prefix-block ids the bench does not use: 3.0 MB -> 0.8 MB).
set -euo pipefail
X=${1:-.whl/x}
mkdir -p "$X/tokenizer"
export OMP_NUM_THREADS=1
MOONCAKE=${MOONCAKE:-../shared/traces/mooncake/conversation_trace.jsonl}
[ -f "$MOONCAKE" ] || MOONCAKE=/work/shared/traces/mooncake/conversation_trace.jsonl
.venv/bin/python - "$X" "$MOONCAKE" <<'PY'
import csv, shutil, sys
from pathlib import Path
from transformers import AutoTokenizer
from deltaserve_core.assets import demo_dataset_path
from deltaserve_core.bench.lengths import sharegpt_lengths
from deltaserve_core.assets import resolve_model

x = Path(sys.argv[1])
tiny = resolve_model("tiny")
for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
    if (tiny / f).is_file():
        shutil.copy(tiny / f, x / "tokenizer" / f)
tok = AutoTokenizer.from_pretrained(tiny)
table = sharegpt_lengths(tok)
with open(x / "lengths.csv", "w", newline="") as fh:
    w = csv.writer(fh)
    w.writerow(["prompt_tokens", "output_tokens"])
    w.writerows(table.pairs)
shutil.copy(demo_dataset_path(), x / "alpaca_en_demo.json")
mc = Path(sys.argv[2]) if len(sys.argv) > 2 else None
if mc is not None and mc.is_file():
    import json
    with open(mc) as src, open(x / mc.name, "w") as dst:
        for line in src:
            if line.strip():
                r = json.loads(line)
                dst.write(json.dumps({k: r[k] for k in ("timestamp", "input_length", "output_length")}) + "\n")
    lic = mc.parent / "LICENSE-APACHE"
    if lic.is_file():
        shutil.copyfile(lic, x / "LICENSE-APACHE-mooncake")  # not its read-only mode: a re-run overwrites it
    print("copied", mc, "->", x / mc.name)
elif mc is not None:
    print("no Mooncake trace at", mc, "(bench_h200.sh then skips it)")
print("prepared", x, table.stats())
PY
du -sh "$X"
