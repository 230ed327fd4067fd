#!/usr/bin/env python3
"""How dsrt's files depend on each other: the figures that say whether the
layers still call downwards only.

    scripts/layers.py cycles BUILD_DIR   # circles of files and folders, and calls up the layers
    scripts/layers.py functions [N]      # the N longest functions outside tests (default 20)
    scripts/layers.py lines              # lines of C per folder

`cycles` reads the call graph from the built objects: a file calls another
when its object file uses a symbol (a function or a variable) that the
other's defines (`nm`), which is exact where parsing C is not: no macro,
no static function and no inline helper in a header is mistaken for a call.
The library objects (dsrt, dsrt_train) and the modules' are read. It prints
every group of files that reach each other (a strongly connected component
of more than one file), with the symbols that close the circle, then the same
for folders (a file's folder; datastore/sources/zip/x.c is in
datastore/sources/zip), and the #include graph's circles between folders.
Last, the layers: LAYERS ranks the folders from the bottom (core/, then
platform/: cores, threads, pinned memory) to the top (the training loop),
and every call or #include from a folder to one ranked above it is printed
as going up. Exit 1 when any circle is found or anything goes up.
`functions` is scripts/function_lengths.py's count.

A table of plug-ins is not a call: the layer kinds' ops structures
(dsrt__layer_<kind>, dsrt__cuda_layer_<kind>: data, nm's R or D) that
the kinds' table names, the sources' (dsrt__source_<name>) that the table
of sources (datastore/sources/source.c) names, and the list of kinds
(nn/layers/list.h) that nn/internal.h includes, are how an engine reaches
a plug-in through function pointers, while the plug-in calls the engine's
services below it; those references are counted apart (printed as
"tables") and close no circle.
"""
import collections
import glob
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A layer kind's ops structure, and the list of kinds (see the docstring).
PLUGIN_TABLE = re.compile(r"^dsrt__((cuda_)?layer_[a-z0-9_]+|layers|source_[a-z0-9]+)$")
PLUGIN_LIST = "nn/layers/list.h"
# The layers, bottom first: a folder is ranked by the longest entry its path
# starts with. A folder calls and includes its own rank and those below;
# within a rank (datastore/'s folders, augment/) the circles above keep the
# order. The public headers (include/) are everyone's and rank nowhere.
LAYERS = {
    "core": 0,
    "platform": 1,  # cores, threads, pinned memory; the CUDA host module
    "datastore": 2,
    "augment": 2,
    "nn": 3,
    "runtime": 3,  # runtime/internal.h, shared by the pipeline and training
    "runtime/pipeline": 3,
    "runtime/comm": 4,
    "runtime/train": 5,
}
LIB_TARGETS = ("dsrt_objects", "dsrt_train_objects", "dsrt_cuda", "dsrt_mpi", "dsrt_nccl",
               "dsrt_cuda_host")


def objects(build):
    """{source path relative to the tree: object file} of the libraries and modules."""
    out = {}
    for t in LIB_TARGETS:
        base = os.path.join(build, "CMakeFiles", t + ".dir")
        for o in glob.glob(os.path.join(base, "**", "*.o"), recursive=True):
            src = os.path.relpath(o, base)[:-2]
            # Objects of sources that are gone (moved, removed) stay in a
            # build folder until it is cleaned: left out.
            if src.endswith((".c", ".cu")) and os.path.isfile(os.path.join(ROOT, src)):
                out.setdefault(src, o)
    return out


def symbols(obj):
    """(defined, used, tables) global symbols of an object file: tables are
    the layer kinds' ops structures it defines."""
    defined, used, tables = set(), set(), set()
    text = subprocess.run(["nm", "-P", obj], capture_output=True, text=True, check=True).stdout
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        name, kind = parts[0], parts[1]
        if kind == "U":
            used.add(name)
        elif kind.isupper() and kind not in "N":
            defined.add(name)
            if kind in "RD" and PLUGIN_TABLE.match(name):
                tables.add(name)
    return defined, used, tables


def scc(nodes, edges):
    """Tarjan's strongly connected components, iteratively."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    advanced = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(sorted(comp))
    return out


def report(title, nodes, edges, why):
    comps = [c for c in scc(nodes, edges) if len(c) > 1]
    print(f"{title}: {len(comps)} circle(s)")
    for c in comps:
        print("  " + " <-> ".join(c))
        members = set(c)
        for a in c:
            for b in sorted(edges.get(a, ())):
                if b in members:
                    names = sorted(why.get((a, b), ()))
                    more = f" (+{len(names) - 4})" if len(names) > 4 else ""
                    print(f"    {a} -> {b}: {', '.join(names[:4])}{more}")
    return len(comps)


def includes():
    """{file: set(included project files)} for every C source and header of the libraries."""
    out = {}
    for d in ("core", "platform", "datastore", "augment", "runtime", "nn", "include"):
        for f in glob.glob(os.path.join(ROOT, d, "**", "*.[ch]"), recursive=True):
            rel = os.path.relpath(f, ROOT)
            incs = set()
            with open(f, errors="replace") as fh:
                for m in re.finditer(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', fh.read(), re.M):
                    name = m.group(1)
                    for cand in (name, os.path.join("include", name),
                                 os.path.join(os.path.dirname(rel), name)):
                        if os.path.isfile(os.path.join(ROOT, cand)):
                            incs.add(os.path.normpath(cand))
                            break
            out[rel] = incs
    return out


def rank(folder):
    """The layer of a folder (LAYERS), or None for one outside them."""
    best = None
    for name, r in LAYERS.items():
        if (folder == name or folder.startswith(name + "/")) and (
                best is None or len(name) > len(best[0])):
            best = (name, r)
    return best[1] if best else None


def upward(title, edges, why):
    """Edges from a folder to one ranked above it: printed, counted."""
    ups = []
    for a in sorted(edges):
        for b in sorted(edges[a]):
            ra, rb = rank(a), rank(b)
            if ra is not None and rb is not None and rb > ra:
                ups.append((a, b))
    print(f"{title}: {len(ups)} going up the layers")
    for a, b in ups:
        names = sorted(why.get((a, b), ()))
        more = f" (+{len(names) - 4})" if len(names) > 4 else ""
        print(f"  {a} (layer {rank(a)}) -> {b} (layer {rank(b)}): {', '.join(names[:4])}{more}")
    return len(ups)


def cycles(build):
    objs = objects(build)
    if not objs:
        sys.exit(f"no library objects under {build}/CMakeFiles: build it first")
    defs, uses = {}, {}
    owner = {}
    tables = set()
    for src, o in objs.items():
        d, u, t = symbols(o)
        defs[src], uses[src] = d, u
        tables |= t
        for s in d:
            owner.setdefault(s, src)
    plugged = collections.defaultdict(set)
    edges, why = collections.defaultdict(set), collections.defaultdict(set)
    fedges, fwhy = collections.defaultdict(set), collections.defaultdict(set)
    for src in objs:
        for s in uses[src]:
            dst = owner.get(s)
            if dst and dst != src and s in tables:
                plugged[src].add(os.path.basename(dst))
            elif dst and dst != src:
                edges[src].add(dst)
                why[(src, dst)].add(s)
                fa, fb = os.path.dirname(src), os.path.dirname(dst)
                if fa != fb:
                    fedges[fa].add(fb)
                    fwhy[(fa, fb)].add(f"{os.path.basename(src)}:{s}")
    n = report("files that call each other", set(objs), edges, why)
    folders = {os.path.dirname(s) for s in objs}
    n += report("folders that call each other", folders, fedges, fwhy)
    inc = includes()
    iedges, iwhy = collections.defaultdict(set), collections.defaultdict(set)
    for f, incs in inc.items():
        for g in incs:
            if g == PLUGIN_LIST:
                continue
            fa, fb = os.path.dirname(f), os.path.dirname(g)
            if fa != fb:
                iedges[fa].add(fb)
                iwhy[(fa, fb)].add(f"{os.path.basename(f)}:{os.path.basename(g)}")
    n += report("folders that include each other's headers", {os.path.dirname(f) for f in inc},
                iedges, iwhy)
    n += upward("folder calls", fedges, fwhy)
    n += upward("folder includes", iedges, iwhy)
    print("tables (a file naming the ops of plug-ins: layer kinds, sources):")
    for a in sorted(plugged):
        print(f"  {a} -> {len(plugged[a])} file(s)")
    print("folder calls (caller -> callee):")
    for a in sorted(fedges):
        print(f"  {a or '.'} -> {', '.join(sorted(b or '.' for b in fedges[a]))}")
    return 1 if n else 0


def functions(top):
    """The longest functions outside tests, by scripts/function_lengths.py."""
    return subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "function_lengths.py"),
                           "--top", str(top)], cwd=ROOT).returncode


def lines():
    files = subprocess.run(["git", "ls-files", "*.c", "*.h", "*.cu"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    per = collections.Counter()
    for f in files:
        with open(os.path.join(ROOT, f), errors="replace") as fh:
            per[os.path.dirname(f)] += sum(1 for _ in fh)
    for d in sorted(per):
        print(f"{per[d]:7d}  {d or '.'}")
    print(f"{sum(per.values()):7d}  total")
    return 0


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "cycles":
        sys.exit(cycles(sys.argv[2]))
    if len(sys.argv) >= 2 and sys.argv[1] == "functions":
        sys.exit(functions(int(sys.argv[2]) if len(sys.argv) > 2 else 20))
    if len(sys.argv) >= 2 and sys.argv[1] == "lines":
        sys.exit(lines())
    sys.exit(__doc__)
