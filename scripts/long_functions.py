#!/usr/bin/env python3
"""Lists the functions longer than a limit (default 80 lines) in the C++
sources outside tests/, longest first: `python3 scripts/long_functions.py
[--limit N] [--tables]`. A function's length runs from the first line of its
signature to its closing brace. Functions that are tables (the Fields()
declarations of Options structs and the config schema, one entry a line)
are counted apart and listed with --tables; the exit code is the number of
other functions over the limit (capped at 100), so a script can gate on it.

The scan matches braces after removing comments, string and character
literals; a brace opens a function body when the text before it ends with
a parameter list (`)`, qualifiers, a trailing return type or a constructor's
initialiser list) at namespace or class scope. Lambdas and local classes
inside a function count towards that function."""
import argparse
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDERS = ["framework", "solvers", "layers", "training", "python", "bench", "examples"]
# Table functions: their body is one declaration per line.
TABLE = re.compile(r"(::Fields\(\)|\bStillpointSchema\(\)|Schema\(\)$)")


def strip(text):
    """Comments, strings and character literals replaced by spaces (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == 'R' and text.startswith('R"', i):
            m = re.match(r'R"([^(]*)\(', text[i:])
            end = text.find(")" + m.group(1) + '"', i) if m else -1
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + " " * (j - i - 2) + c if j - i >= 2 else " ")
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


FUNC_HEAD = re.compile(
    r"\)\s*(const|override|final|noexcept|mutable|&|&&|\s)*(->\s*[\w:<>,\s*&]+)?\s*$")
INIT_LIST = re.compile(r"\)\s*:\s*[\w:]+\s*[({]")


def functions(path):
    text = strip(open(path, encoding="utf-8", errors="replace").read())
    stack = []  # (kind, start line, name)
    head_start = 0
    found = []
    line = 1
    parens = 0  # open parentheses outside function bodies (default arguments)
    for i, c in enumerate(text):
        if c == "\n":
            line += 1
        in_body = stack and stack[-1][0] in ("func", "other")
        if c in "()" and not in_body:
            parens += 1 if c == "(" else -1
        if c in "{}" and parens > 0 and not in_body:
            # a brace inside a signature (`= {}`): matched, not a body
            if c == "{":
                stack.append(("paren", line, ""))
            elif stack:
                stack.pop()
            continue
        if c in ";}":
            if c == "}" and stack:
                kind, start, name = stack.pop()
                if kind == "func":
                    found.append((line - start + 1, start, name))
            if not (c == ";" and parens > 0):
                head_start = i + 1
        elif c == "{":
            head = text[head_start:i]
            if in_body:
                kind = "other"
            elif re.search(r"\bnamespace\b|extern\s*\"", head) or re.search(r'extern\s+"', head):
                kind = "ns"
            elif re.search(r"\b(class|struct|union|enum)\b[^()]*$", head):
                kind = "class"
            elif FUNC_HEAD.search(head) or INIT_LIST.search(head):
                kind = "func"
            else:
                kind = "other"
            start = line
            if kind == "func":
                # the signature's first line: the first non-blank line of the head
                lead = len(head) - len(head.lstrip())
                start = line - head[lead:].count("\n")
            name = ""
            if kind == "func":
                m = re.search(r"([~\w:]+(?:operator\S*)?)\s*\(", head)
                name = m.group(1) if m else head.strip()[:40]
            stack.append((kind, start, name))
            head_start = i + 1
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=80)
    parser.add_argument("--tables", action="store_true", help="also list the table functions")
    args = parser.parse_args()
    long_ones, tables = [], []
    for folder in FOLDERS:
        for dirpath, _, names in os.walk(os.path.join(ROOT, folder)):
            for file in sorted(names):
                if not file.endswith((".cc", ".h")):
                    continue
                path = os.path.join(dirpath, file)
                rel = os.path.relpath(path, ROOT)
                for length, start, name in functions(path):
                    if length <= args.limit:
                        continue
                    entry = (length, f"{rel}:{start}", name)
                    (tables if TABLE.search(name + "()") or TABLE.search(name) else long_ones).append(entry)
    for length, where, name in sorted(long_ones, reverse=True):
        print(f"{length:5d}  {where}  {name}")
    print(f"{len(long_ones)} functions over {args.limit} lines outside tests "
          f"({len(tables)} tables besides)")
    if args.tables:
        for length, where, name in sorted(tables, reverse=True):
            print(f"{length:5d}  {where}  {name}  (table)")
    return min(len(long_ones), 100)


if __name__ == "__main__":
    sys.exit(main())
