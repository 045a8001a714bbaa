"""Builds REPORT.md from the hosts' docstrings, proofs/results.tsv and runs.tsv (no suite source is read)."""
import ast
import csv
from pathlib import Path

B = Path(__file__).resolve().parent


def tsv(path):
    if not path.is_file():
        return {}
    rows = {}
    for line in path.read_text().splitlines():
        parts = line.split("\t")
        if parts and parts[0] not in ("host", ""):
            rows[parts[0]] = parts
    return rows


proofs = tsv(B / "proofs" / "results.tsv")
runs = tsv(B / "runs.tsv")
out = ["# Batch 2026-12-02b: per-host report", "",
       "Each section: the rule (quoted from hooks.py/types.py/driver.py docstrings), the bug, the trigger, the proof "
       "(`proofs/pNN.py`: exit 0 = reference passes and broken host fails) and the suite's verdict "
       "(`run_batch.sh`: rc 1 = caught, rc 0 = missed).", ""]
summary = ["| host | proof | suite | failed checks |", "|---|---|---|---|"]
for f in sorted((B / "blindhosts").glob("h[0-9][0-9]_*.py")):
    mod = f.stem
    nn = mod[1:3]
    doc = ast.get_docstring(ast.parse(f.read_text()))
    p = proofs.get(f"p{nn}")
    plog = B / "proofs" / f"logs_p{nn}.txt"
    plines = [l for l in plog.read_text().splitlines() if l.startswith(f"[p{nn}]")] if plog.is_file() else []
    proof = "not run" if p is None else ("holds (real violation)" if p[1] == "0" else f"DOES NOT hold (rc {p[1]})")
    r = runs.get(mod)
    if r is None:
        verdict, checks = "not run", ""
    else:
        verdict = {"0": "MISSED (suite passed the host)", "1": "CAUGHT"}.get(r[1], f"rc {r[1]} (error)")
        checks = r[3] if len(r) > 3 else ""
    out += [f"## {mod}", "", doc, "", f"**Proof** (`proofs/p{nn}.py`): {proof}", ""]
    out += ["```"] + plines + ["```", ""] if plines else []
    out += [f"**Suite verdict**: {verdict}" + (f"; failed checks: `{checks}`" if checks and checks != "-" else ""), ""]
    summary.append(f"| {mod} | {'real' if p and p[1] == '0' else ('NOT real' if p else '?')} | "
                   f"{verdict.split(' ')[0]} | {checks} |")
(B / "REPORT.md").write_text("\n".join(out[:5] + summary + [""] + out[5:]) + "\n")
print("\n".join(summary))
