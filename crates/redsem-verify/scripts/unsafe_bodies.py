#!/usr/bin/env python3
"""Make the bodies of `unsafe fn`s reachable for cargo-mutants, in a scratch copy of the tree.

cargo-mutants does not mutate the body of an `unsafe fn`. This rewrites each `unsafe fn` of
the files named into a `fn` whose body is one `unsafe { }` block, on the same lines, so the
mutants it lists carry the line numbers of the real files (docs/MUTANTS.md, "Native engine").
Run it only in a copy (`git archive HEAD | tar -x -C <copy>`): it edits the files in place,
and the result is not meant to be committed (callers of the rewritten functions may warn of
an `unsafe` block they no longer need).

Usage: python3 unsafe_bodies.py FILE.rs [FILE.rs ...]
"""
import re
import sys

HEAD = re.compile(r'(pub\(crate\) |pub\(super\) |pub )?unsafe fn ')


def body_start(src, at):
    """The index of the `{` that opens the body of the signature starting at `at`, or None
    for a declaration without a body. Brackets are counted so that a `{` in a type is not
    taken (an arrow's `>` is not a bracket)."""
    depth, i = 0, at
    while i < len(src):
        c = src[i]
        if c in '([' or (c == '<' and src[i - 1] != '-'):
            depth += 1
        elif c in ')]' or (c == '>' and src[i - 1] != '-'):
            depth -= 1
        elif c == '{' and depth <= 0:
            return i
        elif c == ';' and depth <= 0:
            return None
        i += 1
    return None


def body_end(src, open_at):
    """The index just past the `}` that closes the block opened at `open_at` (braces inside
    string and byte literals and in character literals skipped)."""
    depth, i = 1, open_at + 1
    while depth:
        c = src[i]
        if c == '{':
            depth += 1
        elif c == '}':
            depth -= 1
        elif c == '"':
            i += 1
            while src[i] != '"':
                i += 2 if src[i] == '\\' else 1
        elif c == "'" and src[i + 2:i + 3] == "'":
            i += 2
        i += 1
    return i


def rewrite(src):
    out, i = [], 0
    while True:
        m = HEAD.search(src, i)
        if not m:
            out.append(src[i:])
            return ''.join(out)
        out.append(src[i:m.start()] + (m.group(1) or '') + 'fn ')
        start = body_start(src, m.end())
        if start is None:
            i = m.end()
            continue
        end = body_end(src, start)
        out.append(src[m.end():start + 1] + ' unsafe {' + src[start + 1:end - 1] + '}}')
        i = end


if __name__ == '__main__':
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for path in sys.argv[1:]:
        with open(path) as f:
            text = f.read()
        with open(path, 'w') as f:
            f.write(rewrite(text))
