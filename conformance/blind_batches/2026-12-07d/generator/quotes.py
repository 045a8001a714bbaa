import ast, re, sys
from pathlib import Path
HERE = Path(__file__).resolve().parent
src = HERE.parents[3] / "src" / "deltaserve_core"
norm = lambda s: " ".join(s.split())
texts = {f: norm((src / f).read_text()) for f in ("hooks.py", "types.py", "driver.py")}
ok = True
for p in sorted((HERE.parent / "blindhosts").glob("h*.py")):
    doc = ast.get_docstring(ast.parse(p.read_text()))
    rule = doc[doc.index("Rule:"):doc.index("Bug:")]
    files = re.findall(r"(hooks\.py|types\.py|driver\.py)", rule)
    quotes = re.findall(r'"([^"]+)"', norm(rule))
    for q in quotes:
        for part in q.split("[...]"):
            part = part.strip()
            if not part:
                continue
            where = [f for f, t in texts.items() if part in t]
            if not where:
                ok = False
                print("MISSING", p.name, repr(part[:80]))
    print(p.name, len(quotes), "quotes", files)
print("ALL OK" if ok else "SOME MISSING")
