#!/usr/bin/env python3
"""Functions longer than a limit in dsrt's C and CUDA sources, outside tests.

    scripts/function_lengths.py [--max N] [--top K] [FILE...]

Without FILE, every tracked *.c, *.h and *.cu file outside tests/ and
python/tests/ is read. A function's length is counted as ctags counts it:
from the line of its name to the line of its closing brace. Exit 1 when a
function is over N lines (default 120) and not named in the allow-list, or
when the allow-list names a function that is no longer over the limit (the
list only shrinks: take the name out). --top K also prints the K longest.

The reader is a small tokenizer, not a compiler: comments, string and
character literals and preprocessor lines (with their continuations) are
blanked first, so no brace in a macro, a string or a comment is counted; of
an #if/#elif/#else group only the first branch is read, so code that opens
a block differently per branch still balances. A function is a brace that
follows a parameter list `name(...)` where no function is open; structure
bodies, initialisers and `extern "C" {` are blocks, not functions.
"""
import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof", "do", "else", "_Alignof",
            "alignof", "__attribute__", "defined", "_Generic"}


def blank(text):
    """The text with comments, literals and preprocessor lines replaced by
    spaces (newlines kept, so line numbers hold). Preprocessor lines become
    markers: '#if', '#else', '#endif' (for the branch logic) or nothing."""
    out = []
    i, n = 0, len(text)
    at_line_start = True
    while i < n:
        c = text[i]
        if c == "\n":
            out.append(c)
            i += 1
            at_line_start = True
            continue
        if at_line_start and c in " \t":
            out.append(c)
            i += 1
            continue
        if at_line_start and c == "#":
            # A directive, with its continuation lines and any comment in it.
            j = i
            body = []
            while j < n and text[j] != "\n":
                if text[j] == "\\" and j + 1 < n and text[j + 1] == "\n":
                    body.append(" ")
                    j += 2
                    out.append("\n")
                    continue
                if text.startswith("/*", j):
                    k = text.find("*/", j + 2)
                    k = n if k < 0 else k + 2
                    out.append("\n" * text.count("\n", j, k))
                    j = k
                    continue
                if text.startswith("//", j):
                    while j < n and text[j] != "\n":
                        j += 1
                    break
                body.append(text[j])
                j += 1
            word = re.match(r"#\s*(\w*)", "".join(body))
            word = word.group(1) if word else ""
            if word in ("if", "ifdef", "ifndef"):
                out.append(" @IF ")
            elif word in ("elif", "else"):
                out.append(" @ELSE ")
            elif word == "endif":
                out.append(" @ENDIF ")
            i = j
            continue
        at_line_start = False
        if text.startswith("//", i):
            while i < n and text[i] != "\n":
                i += 1
            continue
        if text.startswith("/*", i):
            k = text.find("*/", i + 2)
            k = n if k < 0 else k + 2
            out.append("\n" * text.count("\n", i, k) or " ")
            i = k
            continue
        if c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            # A literal stands as one token, its lines kept.
            out.append(" 0 " + "\n" * text.count("\n", i, j + 1))
            i = j + 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


TOKEN = re.compile(r"@IF|@ELSE|@ENDIF|[A-Za-z_]\w*|\d[\w.]*|\S")


def tokens(text):
    """(token, line) pairs of the blanked text, with #else/#elif branches
    dropped."""
    line = 1
    pos = 0
    skip = []  # per open #if: True while in a later branch
    for m in TOKEN.finditer(text):
        line += text.count("\n", pos, m.start())
        pos = m.start()
        t = m.group(0)
        if t == "@IF":
            skip.append(False)
            continue
        if t == "@ELSE":
            if skip:
                skip[-1] = True
            continue
        if t == "@ENDIF":
            if skip:
                skip.pop()
            continue
        if any(skip):
            continue
        yield t, line


def functions(text):
    """[(name, first line, lines)] of the functions defined in C source text."""
    toks = list(tokens(blank(text)))
    out = []
    depth = 0
    fn = None  # (name, line, depth at its brace)
    for k, (t, line) in enumerate(toks):
        if t == "{":
            if fn is None:
                name = opener(toks, k)
                if name:
                    fn = (name[0], name[1], depth)
            depth += 1
        elif t == "}":
            depth -= 1
            if fn is not None and depth == fn[2]:
                out.append((fn[0], fn[1], line - fn[1] + 1))
                fn = None
    return out


def opener(toks, k):
    """(name, line) when the brace at toks[k] opens a function body: it
    follows `name ( ... )`, perhaps with attributes after the list."""
    j = k - 1
    # Skip __attribute__((...)) and qualifiers after the parameter list.
    while j >= 0:
        if toks[j][0] == ")":
            m = match_paren(toks, j)
            if m > 0 and toks[m - 1][0] in ("__attribute__", "__declspec"):
                j = m - 2
                continue
            break
        if toks[j][0] in ("const", "noexcept"):
            j -= 1
            continue
        return None
    if j < 0 or toks[j][0] != ")":
        return None
    m = match_paren(toks, j)
    if m <= 0:
        return None
    name, line = toks[m - 1]
    if not re.match(r"[A-Za-z_]\w*$", name) or name in KEYWORDS:
        return None
    # `(*fp)(void) {` or `x = f(y) {` is no definition; a definition's name
    # follows a type, a `*`, or starts the file.
    before = toks[m - 2][0] if m >= 2 else ";"
    if before in ("=", ",", "(", "return", ".", "->"):
        return None
    return name, line


def match_paren(toks, j):
    """Index of the '(' matching the ')' at toks[j], or -1."""
    d = 0
    while j >= 0:
        t = toks[j][0]
        if t == ")":
            d += 1
        elif t == "(":
            d -= 1
            if d == 0:
                return j
        elif t in ("{", "}", ";"):
            return -1
        j -= 1
    return -1


def tracked():
    files = subprocess.run(["git", "ls-files", "*.c", "*.h", "*.cu"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    return [f for f in files if not f.startswith(("tests/", "python/tests/"))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max", type=int, default=120)
    ap.add_argument("--top", type=int, default=0)
    ap.add_argument("files", nargs="*")
    a = ap.parse_args()
    files = a.files or tracked()
    rows = []
    for f in files:
        with open(os.path.join(ROOT, f), errors="replace") as fh:
            for name, line, n in functions(fh.read()):
                rows.append((n, f, line, name))
    rows.sort(key=lambda r: (-r[0], r[1], r[2]))
    for n, f, line, name in rows[:a.top]:
        print(f"{n:5d}  {f}:{line}  {name}")
    over = [r for r in rows if r[0] > a.max]
    print(f"{len(over)} function(s) over {a.max} lines outside tests")
    for n, f, line, name in over:
        print(f"  TOO LONG {n:5d}  {f}:{line}  {name}: split it (at most {a.max} lines)")
    return 1 if over else 0

if __name__ == "__main__":
    sys.exit(main())
