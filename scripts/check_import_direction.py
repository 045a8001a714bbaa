"""Check which way imports go: the core never imports an adapter, the conformance suite or an example; adapters
never import each other; the contract (hooks, types, driver, hostkit, adapter_state, lora_spec) imports nothing of
the core's policy, training or runtime. Every import statement counts, including those inside functions; those
under ``if TYPE_CHECKING:`` do not (they never run: annotations only).

    python scripts/check_import_direction.py        # prints the contract's own imports; exit 1 on a violation
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ADAPTERS = ("deltaserve_vllm", "deltaserve_sglang", "deltaserve_slora")
OUTSIDE_CORE = ADAPTERS + ("deltaserve_conformance", "hf_host")
CONTRACT = ("hooks", "types", "driver", "hostkit", "adapter_state", "lora_spec")


def imports(path: Path, package: str) -> set[str]:
    """Absolute names of the modules ``path`` imports (relative imports resolved against ``package``)."""
    names: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If) and _is_type_checking(block.test)
                   for stmt in block.body for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
                names.add(mod)
                names.update(f"{mod}.{a.name}" for a in node.names)  # `from . import x` imports module x
            else:
                names.add(node.module or "")
    return names


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def package_of(path: Path, src: Path) -> str:
    """The package a module's relative imports resolve against (a package's ``__init__`` is its own)."""
    parts = list(path.relative_to(src).with_suffix("").parts)
    return ".".join(parts[:-1])


def main() -> int:
    src = ROOT / "src"
    problems: list[str] = []
    contract_uses: dict[str, set[str]] = {}
    for path in sorted(src.rglob("*.py")):
        top = path.relative_to(src).parts[0]
        got = imports(path, package_of(path, src))
        tops = {n.split(".")[0] for n in got}
        rel = path.relative_to(ROOT)
        if top == "deltaserve_core":
            for bad in sorted(tops & set(OUTSIDE_CORE)):
                problems.append(f"{rel}: the core imports {bad}")
            if path.parent == src / "deltaserve_core" and path.stem in CONTRACT:
                core = {n.split(".")[1] for n in got if n.startswith("deltaserve_core.") and n.count(".") >= 1}
                contract_uses[path.stem] = core
                for bad in sorted(core - set(CONTRACT)):
                    problems.append(f"{rel}: the contract imports deltaserve_core.{bad}")
        elif top in ADAPTERS:
            for bad in sorted(tops & (set(ADAPTERS) - {top})):
                problems.append(f"{rel}: adapter {top} imports adapter {bad}")
    for name, uses in sorted(contract_uses.items()):
        print(f"contract {name}: imports {', '.join(sorted(uses)) or 'nothing'} of deltaserve_core")
    for p in problems:
        print("VIOLATION", p)
    print("ok: the core imports no adapter, no conformance, no example; adapters import no other adapter; the "
          "contract imports only the contract" if not problems else f"{len(problems)} violation(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
