#!/usr/bin/env python3
"""dsgd's size rules, checked by ctest (Lint.FunctionsAndLines):
  - no function in src/ or tools/ longer than 80 lines (signature to closing brace);
  - no line of C++ in src/, tools/, include/, tests/ or bench/ longer than 120 columns (.clang-format's limit);
  - no class in src/ or include/ with more than 30 members (fields and methods; LARGE_CLASSES lists
    the ones still being taken apart, each held to the count it has);
(The layers are fenced by the build, not here: each library compiles against include roots that
hold only its own folders and those of the layers below it; see dsgd_library in CMakeLists.txt.)

  tools/lint/check_style.py [--root DIR]      prints each offence; exit 1 if any

The function finder is a brace matcher over the source with comments, strings and preprocessor
lines blanked: a brace opened outside any function, after a parenthesis that is not an
initialiser, opens a function body. Good enough for this code base's style; not a C++ parser.
"""
import argparse
import os
import re
import sys

MAX_FUNCTION_LINES = 80
MAX_COLUMNS = 120
MAX_CLASS_MEMBERS = 30

# The classes still over MAX_CLASS_MEMBERS, each held to its count until it is made of parts
# (a class that shrinks is held to its new count: lower the figure here).
LARGE_CLASSES = {
    "ReplicaRuntime": 65,
    "GradSync": 63,
    "WorkerPool": 58,
    "Worker": 52,
    "GlooGroup": 51,
    "PsStrategy": 47,
    "DriverServerImpl": 46,
    "ShmGroupImpl": 45,
    "PsAsyncStrategy": 39,
    "NcclGroup": 35,
    # Interfaces, whose members are the hooks a user or a transport implements.
    "TrainingOperator": 48,
    "HierarchicalGroup": 38,
}

def strip(src):
    src = re.sub(r"(?m)^[ \t]*#.*$", lambda m: " " * len(m.group(0)), src)
    out = []; i = 0; n = len(src)
    while i < n:
        c = src[i]
        if src.startswith('//', i):
            j = src.find('\n', i); j = n if j < 0 else j
            out.append(' ' * (j - i)); i = j
        elif src.startswith('/*', i):
            j = src.find('*/', i + 2); j = n if j < 0 else j + 2
            out.append(re.sub(r'[^\n]', ' ', src[i:j])); i = j
        elif src.startswith('R"', i):
            m = re.match(r'R"([^(]*)\(', src[i:])
            end = src.find(')' + m.group(1) + '"', i) + len(m.group(1)) + 2
            out.append(re.sub(r'[^\n]', ' ', src[i:end])); i = end
        elif c in '"\'':
            j = i + 1
            while j < n and src[j] != c:
                j += 2 if src[j] == '\\' else 1
            out.append(' ' * (j + 1 - i)); i = j + 1
        else:
            out.append(c); i += 1
    return ''.join(out)

def functions(text):
    src = strip(text)
    stack = []; header_start = 0; result = []
    line = 1; last = 0
    for i, c in enumerate(src):
        if c == '\n': line += 1
        if c in ';{}':
            if c == '{':
                header = src[last:i]
                in_fn = any(k == 'fn' for k, _ in stack)
                h = header.strip()
                if in_fn: kind = 'other'
                elif re.match(r'(namespace|extern)\b', h): kind = 'ns'
                elif re.search(r'\b(class|struct|union|enum)\b', h.split('(')[0]) and not h.rstrip().endswith(')'): kind = 'class'
                elif '(' in h and not h.endswith('=') and not re.search(r'=\s*$', h): kind = 'fn'
                else: kind = 'other'
                start = line - header.count('\n') + (len(header) - len(header.lstrip())) and line - src[last:i].lstrip().count('\n')
                stack.append((kind, (start, ' '.join(h.split())[:90])))
            elif c == '}' and stack:
                kind, (start, name) = stack.pop()
                if kind == 'fn': result.append((line - start + 1, start, name))
            last = i + 1
    return result


MEMBER_SKIP = re.compile(r"(using|friend|typedef|static_assert|template\s*<[^;]*>\s*(class|struct))\b")


def class_members(text):
    """(members, line, name) of each class or struct body: declarations and inline definitions
    directly inside it (nested classes and enums are their own). Braces and semicolons inside
    parentheses (a default argument's `= {}`, a lambda passed along) belong to that declaration."""
    src = list(strip(text)); depth = 0
    for i, c in enumerate(src):
        if c == '(': depth += 1
        elif c == ')': depth = max(0, depth - 1)
        elif depth > 0 and c in '{};': src[i] = ' '
    src = ''.join(src)
    stack = []; result = []; line = 1; last = 0
    for i, c in enumerate(src):
        if c == '\n': line += 1
        if c not in ';{}':
            continue
        header = re.sub(r'\b(public|private|protected)\s*:', ' ', src[last:i]).strip()
        top = stack[-1] if stack else None
        in_class = top is not None and top[0] == 'class'
        if c == '{':
            first = header.split('(')[0]
            m = re.search(r'\b(class|struct|union)\s+(\w+(::\w+)*)', first)
            if re.search(r'\benum\b', first):
                kind, name = 'enum', ''
            elif m and not header.rstrip().endswith(')'):
                outer = [f[1] for f in stack if f[0] == 'class']
                kind, name = 'class', '::'.join(outer[-1:] + [m.group(2)]) if outer and '::' not in m.group(2) else m.group(2)
            else:
                kind, name = 'other', ''
                if in_class and header and not MEMBER_SKIP.match(header): top[2][0] += 1
            stack.append((kind, name, [0], line))
        elif c == '}' and stack:
            kind, name, count, start = stack.pop()
            if kind == 'class': result.append((count[0], start, name))
        elif c == ';' and in_class and header and not MEMBER_SKIP.match(header):
            top[2][0] += 1
        last = i + 1
    return result


def cpp_files(root, folders):
    for folder in folders:
        for dirpath, _, names in os.walk(os.path.join(root, folder)):
            if "compat" in dirpath.split(os.sep):  # a stand-in for a Gloo header, kept as Gloo wrote it
                continue
            for name in sorted(names):
                if name.endswith((".cpp", ".h")):
                    yield os.path.join(dirpath, name)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    root = os.path.normpath(parser.parse_args().root)
    offences = 0
    for path in cpp_files(root, ["src", "tools"]):
        with open(path, encoding="utf-8") as f:
            for n, start, name in functions(f.read()):
                if n > MAX_FUNCTION_LINES:
                    offences += 1
                    print(f"{os.path.relpath(path, root)}:{start}: {n} lines (at most {MAX_FUNCTION_LINES}): {name}")
    for path in cpp_files(root, ["src", "tools", "include", "tests", "bench"]):
        with open(path, encoding="utf-8") as f:
            for i, line in enumerate(f, 1):
                if len(line.rstrip("\n")) > MAX_COLUMNS:
                    offences += 1
                    print(f"{os.path.relpath(path, root)}:{i}: {len(line.rstrip())} columns (at most {MAX_COLUMNS})")
    for path in cpp_files(root, ["src", "include"]):
        with open(path, encoding="utf-8") as f:
            for n, start, name in class_members(f.read()):
                limit = max(MAX_CLASS_MEMBERS, LARGE_CLASSES.get(name, 0))
                if n > limit:
                    offences += 1
                    print(f"{os.path.relpath(path, root)}:{start}: class {name} has {n} members (at most {limit}): "
                          "give its concerns classes of their own")
    print(f"check_style: {offences} offence(s)")
    return 1 if offences else 0


if __name__ == "__main__":
    sys.exit(main())
