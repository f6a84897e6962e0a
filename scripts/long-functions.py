#!/usr/bin/env python3
"""Lists the functions longer than a limit (default 80 lines) in the given source folders, test
modules left out: `python3 scripts/long-functions.py crates/train/src [--limit 80]`. Exits 1 when
one is found."""
import os
import re
import sys


def long_functions(root, limit):
    for folder, _, files in os.walk(root):
        for name in sorted(files):
            if not name.endswith('.rs'):
                continue
            path = os.path.join(folder, name)
            lines = open(path, encoding='utf-8').read().split('\n')
            for i, line in enumerate(lines):
                if line.startswith('#[cfg(test)]'):
                    break
                m = re.match(r'^(\s*)(pub(\([a-z]+\))? )?(async )?fn (\w+)', line)
                if not m:
                    continue
                end = next((j for j in range(i + 1, len(lines)) if lines[j] == m.group(1) + '}'), i)
                if end - i + 1 > limit:
                    yield end - i + 1, path, m.group(5)


def main():
    args = sys.argv[1:]
    limit = 80
    if '--limit' in args:
        at = args.index('--limit')
        limit = int(args[at + 1])
        del args[at:at + 2]
    found = sorted((f for root in args for f in long_functions(root, limit)), reverse=True)
    for n, path, name in found:
        print(f'{n:5} {path} {name}')
    print(f'{len(found)} functions over {limit} lines')
    sys.exit(1 if found else 0)


if __name__ == '__main__':
    main()
