"""Imports point backwards only: a chapter's module may import earlier chapters, never a later one (issue 12)."""
import ast, json, re
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = 'netlite_nb'

def chapter_order()->dict[str, str]:
    "module name -> the notebook that exports it (its chapter key, e.g. '06a_checkpoint'), from each notebook's `#| default_exp`."
    order = {}
    for nb in sorted((ROOT / 'nbs').glob('[0-9]*.ipynb')):
        for c in json.loads(nb.read_text())['cells']:
            m = re.search(r'^#\|\s*default_exp\s+(\S+)', ''.join(c['source']), re.M)
            if c['cell_type'] == 'code' and m: order[m.group(1)] = nb.stem; break
    return order

def imported_modules(tree:ast.AST, module:str)->list[tuple[int, str]]:
    "Every netlite_nb module `tree` imports, wherever the import stands: module level, inside functions, or via importlib/__import__."
    found = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Import): found += [(n.lineno, a.name) for a in n.names]
        elif isinstance(n, ast.ImportFrom):
            base = n.module or ''
            if n.level: base = '.'.join([PKG, base]).rstrip('.') if n.level == 1 else base  # `from .probe import x` / `from . import x`
            found += [(n.lineno, base)] + [(n.lineno, f"{base}.{a.name}") for a in n.names]
        elif isinstance(n, ast.Call):
            f = n.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, 'id', '')
            if name in ('import_module', '__import__') and n.args:
                a = n.args[0]
                found.append((n.lineno, a.value if isinstance(a, ast.Constant) and isinstance(a.value, str) else '<dynamic>'))
    return [(ln, m) for ln, m in found if m == '<dynamic>' or m == PKG or m.startswith(PKG + '.')]

def test_every_module_is_a_chapter():
    order = chapter_order()
    mods = {p.stem for p in (ROOT / PKG).glob('*.py') if not p.stem.startswith('_')}
    assert mods <= set(order), f"modules with no notebook: {sorted(mods - set(order))}"
    assert len(set(order.values())) == len(order), "two notebooks export one module"

def test_imports_point_backwards():
    order = chapter_order()
    bad = []
    for mod, chap in order.items():
        src = (ROOT / PKG / f"{mod.replace('.', '/')}.py").read_text()
        for ln, target in imported_modules(ast.parse(src), mod):
            if target == '<dynamic>': bad.append(f"{mod}.py:{ln} imports a module whose name is computed at run time"); continue
            name = module_of(target, order)
            if name is None: continue  # the package itself, `_modidx`, or a name imported from a module
            if order[name] >= chap and name != mod and not own_appendix(name, mod, order):
                bad.append(f"{mod}.py:{ln} imports {target}, chapter {order[name]}, not before {chap}")
    assert not bad, '\n'.join(bad)

def module_of(target:str, order:dict)->str|None:
    "The chapter module `target` names or lies in (`netlite_nb.memory.trace.X` -> `memory.trace`), or None."
    parts = target[len(PKG) + 1:].split('.') if target != PKG else []
    return next(('.'.join(parts[:i]) for i in range(len(parts), 0, -1) if '.'.join(parts[:i]) in order), None)

def own_appendix(name:str, mod:str, order:dict)->bool:
    "A main chapter (01_budget) may import the modules of its own appendices (01a_trace's `memory.trace`), which live in a subpackage."
    main, app = order[mod], order[name]
    num = re.match(r'\d+', main).group()
    return '.' in name and re.fullmatch(rf'{num}[a-z]_\w+', app) is not None and re.fullmatch(rf'{num}_\w+', main) is not None

def test_the_check_catches_forward_imports():
    "The AST reader sees each form of import a chapter could use to reach a later one."
    src = ("import netlite_nb.export\nfrom netlite_nb.train import Trainer\nfrom .optim import AdamW8bit\n"
           "def f():\n    from netlite_nb import layers\n    import importlib; importlib.import_module('netlite_nb.cli')\n    __import__(name)\n")
    got = [m for _, m in imported_modules(ast.parse(src), 'budget')]
    for m in ('netlite_nb.export', 'netlite_nb.train', 'netlite_nb.optim', 'netlite_nb.layers', 'netlite_nb.cli'): assert m in got, m
    assert '<dynamic>' in got  # `__import__(name)`: a module chosen at run time could be any chapter, so it is flagged
    assert [m for _, m in imported_modules(ast.parse("import torch, os\nfrom torch import nn"), 'x')] == []

def test_subpackage_modules_are_checked_too():
    "Imports of `memory.*` / `training.*` resolve to their chapter; only a main chapter may import its own appendices' modules."
    order = {'budget': '01_budget', 'memory.trace': '01a_trace', 'optim': '03_optim', 'train': '07_train', 'training.oom': '07a_oom'}
    test = lambda target, mod: (n := module_of(target, order)) is not None and order[n] >= order[mod] and n != mod and not own_appendix(n, mod, order)
    assert module_of('netlite_nb.memory.trace.make_optimizer', order) == 'memory.trace'
    assert not test('netlite_nb.memory.trace', 'budget') and not test('netlite_nb.training.oom.OOMReport', 'train')  # 01 -> 01a, 07 -> 07a
    assert test('netlite_nb.training.oom', 'optim')        # 03 -> 07a: forward
    assert test('netlite_nb.train', 'memory.trace')        # an appendix module reaching a later chapter
    assert test('netlite_nb.training.oom', 'memory.trace') # one appendix module reaching another chapter's appendix
