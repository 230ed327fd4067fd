#!/usr/bin/env python3
"""The options README.md and docs/*.md name against the tools' --help.

    tests/docs_options.py SOURCE_DIR TOOLS_DIR

Reads `dstrain --help`, `dstrain COMMAND --help` for every command it lists
and `dsbench --help` (and dsbench's commands' help), and collects every
option they show. Then every `--option` the pages name is looked up there:
in a command line of a code block that runs dstrain or dsbench, and in the
prose's `code` spans. Other programs' options (cmake, ctest, mpirun, pip,
the scripts) are told apart: a code block line that does not run a dsrt
tool is skipped, a span that names another program or a script is skipped
with it, and the few benchmark scripts' options the prose names on their
own are listed in SCRIPT_OPTIONS with the file that has each. Exit 1, naming the page, the line and the option, when a
page names an option no tool has.
"""
import os
import re
import subprocess
import sys

OPTION = re.compile(r"(?<![\w-])--([a-z][a-z0-9-]*)")
TOOL = re.compile(r"(^|[\s/;(|&])(dstrain|dsbench)(\s|$)")
# Spans and code lines of other programs: their options are theirs.
OTHER = re.compile(r"\b(cmake|ctest|mpirun|mpiexec|torchrun|pip|pytest|python3?|apt(-get)?|"
                   r"valgrind|ninja|git|curl|nvcc|clang-format|pkg-config|tar|scripts/[\w.-]+|"
                   r"[\w-]+\.(sh|py|pc))\b|-Wl,")
# Options of the benchmark scripts and of pip that the prose names apart from
# their command, with the file that has each (checked: an option that leaves
# its script is reported too). pip's is pip's.
SCRIPT_OPTIONS = {
    "channels-last": "scripts/device-kit.sh",
    "nginx-cache": "python/bench/s3_bench.py",
    "variety": "scripts/bench-loader.sh",
    "loaders-only": "python/bench/train_fmnist.py",
    "no-build-isolation": None,
}


def help_text(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    return r.stdout + r.stderr


def tool_options(tools):
    """Every option the tools' help texts show."""
    opts = set()
    for tool in ("dstrain", "dsbench"):
        exe = os.path.join(tools, tool)
        if not os.access(exe, os.X_OK):
            sys.exit(f"docs_options: {exe}: not built")
        top = help_text([exe, "--help"])
        opts |= set(OPTION.findall(top))
        # Commands: lines "  name   description" of the top help.
        for m in re.finditer(r"^  ([a-z][a-z-]+)\s{2,}\S", top, re.M):
            opts |= set(OPTION.findall(help_text([exe, m.group(1), "--help"])))
    return opts


def named(page):
    """(line number, option, context) of every dsrt tool option a page names."""
    fence = False
    with open(page) as fh:
        lines = fh.read().split("\n")
    cont = False  # a code line continued with a backslash from a tool's line
    for n, line in enumerate(lines, 1):
        if line.startswith("```"):
            fence = not fence
            cont = False
            continue
        if fence:
            code = line.split(" #", 1)[0]
            ours = cont or (TOOL.search(code) and not OTHER.search(code.split("dst")[0]))
            if ours:
                for o in OPTION.findall(code):
                    yield n, o, line.strip()
            cont = bool(ours) and code.rstrip().endswith("\\")
            continue
        for span in re.findall(r"`([^`]+)`", line):
            if OTHER.search(span):
                continue
            for o in OPTION.findall(span):
                yield n, o, span
    # Spans broken over two lines: joined, the same rule.
    text = re.sub(r"```.*?```", "", "\n".join(lines), flags=re.S)
    for span in re.findall(r"`([^`\n]*\n[^`\n]*)`", text):
        if OTHER.search(span):
            continue
        for o in OPTION.findall(span):
            yield 0, o, span.replace("\n", " ")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, tools = sys.argv[1], sys.argv[2]
    have = tool_options(tools)
    bad = 0
    for o, path in SCRIPT_OPTIONS.items():
        if path is None:
            continue
        with open(os.path.join(src, path)) as fh:
            if "--" + o not in fh.read():
                print(f"docs_options: --{o} is no longer in {path}: take it off SCRIPT_OPTIONS")
                bad += 1
        have.add(o)
    have.add("no-build-isolation")
    pages = [os.path.join(src, "README.md")]
    docs = os.path.join(src, "docs")
    pages += sorted(os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md"))
    checked = 0
    for page in pages:
        for n, o, ctx in named(page):
            checked += 1
            if o not in have:
                where = f"{os.path.relpath(page, src)}:{n}" if n else os.path.relpath(page, src)
                print(f"{where}: --{o}: no dstrain or dsbench command has it ({ctx})")
                bad += 1
    print(f"docs_options: {checked} option names in {len(pages)} pages, {len(have)} options "
          f"in the tools' help, {bad} unknown")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
