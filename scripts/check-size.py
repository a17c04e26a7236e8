#!/usr/bin/env python3
"""check-size.py - the size rules of src/ (issue 24): no file over 1,200 lines, no function over 150.

A function is what clang-format makes of one in our style: its opening brace alone on a line
at column 0 (or ending its signature's last line, as in a file formatted otherwise), its
closing brace alone at column 0; its length counts the lines from the
signature's first line to the closing brace. Prints each breach as FILE:LINE and exits 1 when
there is one; with --list, prints every file and function over half the limits.
"""
import os
import re
import sys

FILE_MAX = 1200
FUNC_MAX = 150


SIGNATURE = re.compile(r"^[A-Za-z_][^=;]*\(.*\)[\sA-Za-z_0-9()]*\{$")


def functions(lines):
    start = None
    for i, line in enumerate(lines):
        s = re.sub(r"\s*/\*.*\*/\s*$|\s*//.*$", "", line.rstrip())  # its comment and spaces
        if s.endswith("{") and (i > 0 or s != "{") and not s.startswith("#"):
            j = i if s != "{" else i - 1
            # the signature: back to the line that starts at column 0 with a type or name
            while j > 0 and (lines[j].startswith((" ", "\t")) or lines[j].strip() == ""):
                j -= 1
            sig = " ".join(x.strip() for x in lines[j:i + 1])
            if s != "{" and not SIGNATURE.match(sig):
                continue  # a struct, an initializer, a block inside a function: not a start
            m = re.search(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(", lines[j])
            start = (j, m.group(1) if m else "?")
        elif s in ("}", "};") and start is not None:
            yield start[1], start[0] + 1, i - start[0] + 1
            start = None


def main():
    root = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else "src"
    listing = "--list" in sys.argv
    bad = 0
    for dirpath, _, names in sorted(os.walk(root)):
        for name in sorted(names):
            if not name.endswith((".c", ".h")):
                continue
            path = os.path.join(dirpath, name)
            with open(path, encoding="utf-8", errors="replace") as f:
                lines = f.readlines()
            if len(lines) > FILE_MAX:
                print(f"{path}:1: {len(lines)} lines (at most {FILE_MAX})")
                bad += 1
            elif listing and len(lines) > FILE_MAX // 2:
                print(f"{path}: {len(lines)} lines")
            for fn, line, n in functions(lines):
                if n > FUNC_MAX:
                    print(f"{path}:{line}: {fn}() is {n} lines (at most {FUNC_MAX})")
                    bad += 1
                elif listing and n > FUNC_MAX // 2:
                    print(f"{path}:{line}: {fn}() {n} lines")
    if bad:
        print(f"check-size: {bad} over the limits", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
