#!/usr/bin/env python3
"""Import circles between the source files of a Cargo workspace (or one crate).

Reads every `use` declaration and every inline path (`crate::a::b`, `super::x`, `self::y`,
`<other_crate>::a`) in each .rs file under the given crate roots, resolves it to the file that
defines the module it names (longest prefix that is a file), and reports the strongly connected
components of that graph with more than one file. `mod x;` declarations are not imports.
"""
import os, re, sys, collections, json

def crate_roots(args):
    roots = {}
    for a in args:
        name, path = a.split('=')
        roots[name] = path
    return roots

def module_files(src):
    """module path tuple -> file"""
    out = {}
    for dp, _, fns in os.walk(src):
        for f in fns:
            if not f.endswith('.rs'): continue
            p = os.path.join(dp, f)
            rel = os.path.relpath(p, src)[:-3].split(os.sep)
            # A main.rs beside a lib.rs is a binary crate of its own (it reaches the library by its
            # name), not the library's root.
            if rel == ['main'] and os.path.exists(os.path.join(src, 'lib.rs')): continue
            if rel in (['lib'], ['main']): mod = ()
            elif rel[-1] == 'mod': mod = tuple(rel[:-1])
            else: mod = tuple(rel)
            out[mod] = p
    return out

STRIP = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\])*"', re.S)

def strip_tests(text):
    # leave out the unit tests' blocks, #[cfg(test)] mod tests { ... } and the libraries'
    # #[cfg(feature = "unit-tests")] ... pub mod tests { ... }: their imports are the tests', not the module's
    out = []; i = 0
    for m in re.finditer(r'#\[cfg\((?:test|feature = "unit-tests")\)\](?:\s*#\[[^\]]*\])*\s*(?:pub(?:\(crate\))?\s+)?mod\s+\w+\s*\{', text):
        if m.start() < i: continue
        out.append(text[i:m.start()])
        depth = 1; j = m.end()
        while j < len(text) and depth:
            depth += {'{': 1, '}': -1}.get(text[j], 0); j += 1
        i = j
    out.append(text[i:])
    return ''.join(out)

def expand_use(tree):
    """a::{b, c::{d, e}} -> [a::b, a::c::d, a::c::e]"""
    tree = re.sub(r'\s+', '', tree)
    def rec(prefix, s):
        res = []; depth = 0; cur = ''
        items = []
        for ch in s:
            if ch == '{': depth += 1
            if ch == '}': depth -= 1
            if ch == ',' and depth == 0: items.append(cur); cur = ''
            else: cur += ch
        if cur: items.append(cur)
        for it in items:
            if '{' in it:
                head, body = it.split('{', 1)
                res += rec(prefix + head, body[:-1])
            else:
                res.append(prefix + it)
        return res
    return rec('', tree)

def main():
    roots = crate_roots(sys.argv[1:])
    files = {}  # (crate, modpath) -> file
    for c, src in roots.items():
        for m, f in module_files(src).items(): files[(c, m)] = f
    edges = collections.defaultdict(set)
    for (c, mod), f in files.items():
        text = STRIP.sub('', strip_tests(open(f).read()))
        paths = []
        for m in re.finditer(r'\buse\s+([^;]+);', text):
            paths += expand_use(m.group(1))
        paths += re.findall(r'\b((?:crate|super|self|' + '|'.join(roots) + r')(?:::\w+)+)', text)
        # inline paths through a child module (`dla::Dla::new(..)` in the module that declares `mod dla;`)
        children = [m[-1] for (cc, m) in files if cc == c and len(m) == len(mod) + 1 and m[:-1] == mod]
        if children:
            paths += re.findall(r'(?<![:\w])((?:' + '|'.join(children) + r')(?:::\w+)+)', text)
        for p in paths:
            p = p.split(' as ')[0]
            seg = p.split('::')
            if seg[0] == 'crate': tc, base = c, (); seg = seg[1:]
            elif seg[0] in roots: tc, base = seg[0], (); seg = seg[1:]
            elif seg[0] in ('super', 'self'):
                tc = c; base = mod if not f.endswith('mod.rs') and not f.endswith(('lib.rs','main.rs')) else mod
                # a file foo.rs (module a::foo): self = a::foo, super = a
                while seg and seg[0] in ('super', 'self'):
                    if seg[0] == 'super': base = base[:-1]
                    seg = seg[1:]
            else:
                # a child module of this one (`use fit::Trained` after `mod fit;`)
                tc, base = c, mod
                if (c, mod + (seg[0],)) not in files: continue
            target = None
            full = base + tuple(seg)
            for n in range(len(full), -1, -1):
                if (tc, full[:n]) in files: target = (tc, full[:n]); break
            if target and target != (c, mod): edges[(c, mod)].add(target)
    # Tarjan
    idx, low, st, on, comps, k = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(100000)
    def visit(v):
        idx[v] = low[v] = k[0]; k[0] += 1; st.append(v); on.add(v)
        for w in edges.get(v, ()):
            if w not in idx: visit(w); low[v] = min(low[v], low[w])
            elif w in on: low[v] = min(low[v], idx[w])
        if low[v] == idx[v]:
            comp = []
            while True:
                w = st.pop(); on.discard(w); comp.append(w)
                if w == v: break
            if len(comp) > 1: comps.append(comp)
    for v in files:
        if v not in idx: visit(v)
    name = lambda v: files[v]
    print(f"{len(files)} files, {sum(len(e) for e in edges.values())} import edges, {len(comps)} circles")
    for comp in sorted(comps, key=len, reverse=True):
        print(f"- circle of {len(comp)} files: " + ', '.join(sorted(name(v) for v in comp)))
        if os.environ.get('EDGES'):
            for v in sorted(comp, key=name):
                for w in sorted(edges[v], key=name):
                    if w in comp: print(f"    {name(v)} -> {name(w)}")
    sys.exit(1 if comps else 0)

main()
