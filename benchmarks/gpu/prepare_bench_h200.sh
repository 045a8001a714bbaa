#!/usr/bin/env bash
# Here (CPU machine), before benchmarks/gpu/bench_h200.sh: assemble .whl/x (git-ignored, carried to the GPU machine,
# < 4 MiB) with what the GPU machine cannot fetch: a tokenizer for the Llama-3-8B-shaped model (the tiny model's
# byte-level BPE: the benchmark sends random token ids, so only the lengths of the fine-tuning data depend on it),
# ShareGPT prompt/output lengths counted in that tokenizer (the 125 MB ShareGPT file is too big to carry), and the
# Alpaca demo fine-tuning set.
set -euo pipefail
X=${1:-.whl/x}
mkdir -p "$X/tokenizer"
export OMP_NUM_THREADS=1
.venv/bin/python - "$X" <<'PY'
import csv, shutil, sys
from pathlib import Path
from transformers import AutoTokenizer
from deltaserve_core.assets import demo_dataset_path
from deltaserve_core.bench.lengths import sharegpt_lengths
from deltaserve_core.demo import resolve_model

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
print("prepared", x, table.stats())
PY
du -sh "$X"
