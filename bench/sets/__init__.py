"""The sets of models `bench/budget_accuracy.py --set NAME` measures: one file a round, in the order they were brought.

Each file holds MODELS (name: (factory, input shape, batch sizes)) and, where its models need them, TARGETS (name: batch size ->
targets; otherwise 10 class labels), LOSSES (name: loss; otherwise the planner's default) and TOKENS (name: (ids drawn from, labels
drawn from), for models that take token ids). A new model family is a new file here, its name in NAMES, and a row of
bench/results/budget_accuracy/changelog.json."""
import importlib

NAMES = ('default', 'families', 'variants', 'unseen', 'brought', 'fourth', 'fifth', 'sixth', 'seventh', 'eighth', 'ninth', 'tenth', 'eleventh', 'twelfth')
MODULES = {n: importlib.import_module(f'{__name__}.{n}') for n in NAMES}
SETS = {n: m.MODELS for n, m in MODULES.items()}
TARGETS, LOSSES, TOKENS = ({k: v for m in MODULES.values() for k, v in getattr(m, table, {}).items()} for table in ('TARGETS', 'LOSSES', 'TOKENS'))
ALL = {k: v for s in SETS.values() for k, v in s.items()}
assert all(ALL[k] is d[k] or ALL[k][1:] == d[k][1:] and ALL[k][0].__qualname__ == d[k][0].__qualname__ != '<lambda>' for d in SETS.values() for k in d), \
    'two sets name different models alike: `make` would run one in place of the other'
