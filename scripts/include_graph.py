#!/usr/bin/env python3
"""The includes inside one folder of the tree, drawn as floors: a file (a .h with its .cc or
.cu, and X_internal.h with X, count as one) stands above everything it includes from the same
folder, so an arrow never runs back up unless two files include each other, directly or
around a circle.

    scripts/include_graph.py producer            floors, top first, each file's includes
    scripts/include_graph.py --dot client        the same as a Graphviz digraph
    scripts/include_graph.py --check client producer
                                                 exit 1 naming any circle (the layers test)
"""

import argparse
import re
import sys
from pathlib import Path

# The folder an include names is its last one: "pipeline/decode/decode.h" is decode/'s.
INCLUDE = re.compile(r'^#include "(?:[a-z_]+/)*([a-z_]+)/([A-Za-z0-9_]+)\.(?:h|cuh)"', re.M)


def unit_of(stem):
    """A class's private header (producer_internal.h: its Impl) belongs to the class."""
    return stem[: -len("_internal")] if stem.endswith("_internal") else stem


def units(folder):
    """{unit: set of units it includes from the same folder}; a unit is a file's stem."""
    graph = {}
    for path in sorted(folder.iterdir()):
        if path.suffix not in (".h", ".cc", ".cu"):
            continue
        unit = unit_of(path.stem)
        deps = graph.setdefault(unit, set())
        for where, stem in INCLUDE.findall(path.read_text(errors="replace")):
            if where == folder.name and unit_of(stem) != unit:
                deps.add(unit_of(stem))
    for deps in graph.values():
        deps.intersection_update(graph)
    return graph


def circles(graph):
    """Every circle of includes, each as the list of units around it (depth-first search)."""
    found, state, stack = [], {}, []

    def visit(u):
        state[u] = "open"
        stack.append(u)
        for v in sorted(graph[u]):
            if state.get(v) == "open":
                found.append(stack[stack.index(v):] + [v])
            elif v not in state:
                visit(v)
        stack.pop()
        state[u] = "done"

    for u in sorted(graph):
        if u not in state:
            visit(u)
    return found


def floors(graph):
    """Floor of each unit: 1 + the highest floor it includes (1: includes nothing here)."""
    floor = {}

    def height(u, seen=()):
        if u not in floor:
            below = [height(v, seen + (u,)) for v in graph[u] if v not in seen]
            floor[u] = 1 + max(below, default=0)
        return floor[u]

    for u in graph:
        height(u)
    return floor


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folders", nargs="+", help="folders of the tree (common, client, producer, ...)")
    p.add_argument("--root", default=Path(__file__).resolve().parent.parent, type=Path)
    p.add_argument("--dot", action="store_true", help="print a Graphviz digraph")
    p.add_argument("--check", action="store_true", help="only check: exit 1 on a circle")
    args = p.parse_args()
    status = 0
    for name in args.folders:
        graph = units(args.root / name)
        loops = circles(graph)
        for loop in loops:
            print("include_graph: %s/ has a circle: %s" % (name, " -> ".join(loop)), file=sys.stderr)
            status = 1
        if args.check:
            continue
        if args.dot:
            print("digraph %s {" % name)
            for u in sorted(graph):
                for v in sorted(graph[u]):
                    print('  "%s" -> "%s";' % (u, v))
            print("}")
            continue
        floor = floors(graph)
        print("%s/ (%d units, %d circles)" % (name, len(graph), len(loops)))
        for level in sorted(set(floor.values()), reverse=True):
            for u in sorted(k for k, f in floor.items() if f == level):
                print("  floor %d  %-22s -> %s" % (level, u, ", ".join(sorted(graph[u])) or "-"))
    return status


if __name__ == "__main__":
    sys.exit(main())
