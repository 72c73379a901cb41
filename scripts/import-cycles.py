#!/usr/bin/env python3
"""Reports import cycles between the modules (files) of src/, and between its folders.

Reads `use crate::a::b`, `use super::x` and inline `super::x::`/`crate::a::` paths, maps
each to the module file it names, and prints every cycle found; exits 1 if there is one.
Usage: python3 scripts/import-cycles.py [SRC_DIR]
"""
import re
import sys
from pathlib import Path

src = Path(sys.argv[1] if len(sys.argv) > 1 else "src")
files = {}
for path in src.rglob("*.rs"):
    rel = path.relative_to(src).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    files[tuple(parts)] = path


def resolve(base, segments):
    """The longest module prefix of `segments` (from `base`) that is a file."""
    for n in range(len(segments), 0, -1):
        candidate = tuple(base) + tuple(segments[:n])
        if candidate in files:
            return candidate
    return None


edges = {}
for module, path in files.items():
    text = path.read_text()
    # Test modules may import their parent freely.
    text = text.split("#[cfg(test)]")[0]
    targets = set()
    for match in re.finditer(r"\b(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)+)", text):
        root, rest = match.group(1), match.group(2).split("::")[1:]
        is_mod_file = path.stem in ("mod", "lib", "main")
        if root == "crate":
            base = []
        else:
            base = list(module) if is_mod_file else list(module[:-1])
            base = base[:-1] if is_mod_file else base
        target = resolve(base, rest)
        if target and target != module:
            targets.add(target)
    edges[module] = targets


def cycles(graph):
    found, state, stack = [], {}, []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def name(module):
    return "::".join(module) or "crate"


# A parent module declaring its children (`mod x;`, re-exports) is not a dependency.
module_graph = {m: {t for t in ts if t[: len(m)] != m} for m, ts in edges.items()}
folder_graph = {}
for module, targets in module_graph.items():
    top = module[:1]
    for target in targets:
        if target[:1] != top and top and target[:1]:
            folder_graph.setdefault(top, set()).add(target[:1])

problems = [("modules", c) for c in cycles(module_graph)] + [("folders", c) for c in cycles(folder_graph)]
for kind, cycle in problems:
    print(f"{kind}: " + " -> ".join(name(m) for m in cycle))
print(f"import cycles: {len(problems)}")
sys.exit(1 if problems else 0)
