"Appendix 01e's accuracy page: stored bench results loaded, summarised per machine class, and refused clearly when a file is not one."
import json, sys
from pathlib import Path
import pytest
from netlite_nb.memory.accuracy import ResultTable, changelog_table, load_results, machine_class, results_dir, summary_tables

ROOT = Path(__file__).resolve().parents[1]
EPYC = dict(cpu='AMD EPYC', cpu_vendor='AMD', isa='AVX2', gpu=None)

def result(set_name, errors, machine=EPYC, calibrated=None, **kw):
    rows = [dict(model=f'm{i}', batch=8, measured=2**20, planned=round(2**20 * (1 + e / 100)), error_pct=e) for i, e in enumerate(errors)]
    for row, c in zip(rows, calibrated or []): row.update(calibrated=0, calibrated_error_pct=c)
    return dict(set=set_name, machine=machine, measured_on=kw.pop('measured_on', 'cpu'), options={}, rows=rows, **kw)

def write(d, name, r): (d / name).write_text(json.dumps(r))

def test_load_sorts_by_set_and_skips_the_changelog(tmp_path):
    write(tmp_path, 'z.json', result('families', [1.0]))
    write(tmp_path, 'a.json', result('tenth', [2.0]))
    write(tmp_path, 'changelog.json', dict(rows=[]))
    got = load_results(tmp_path)
    assert [(r['set'], r['file']) for r in got] == [('families', 'z.json'), ('tenth', 'a.json')]

def test_no_folder_is_no_results_and_no_changelog(tmp_path):
    assert load_results(tmp_path / 'missing') == []
    assert summary_tables([]) == []
    t = changelog_table(tmp_path / 'missing' / 'changelog.json')
    assert t.rows == [] and 'No changelog here' in t.note

def test_summary_per_machine_class(tmp_path):
    xeon = dict(cpu='Intel Xeon', cpu_vendor='Intel', isa='AVX-512', gpu=None)
    write(tmp_path, 'f.json', result('families', [0.5, -1.0, 6.0, 2.0], calibrated=[0.1, -0.2, 1.0, -7.5], commit='abc1234', date='2026-12-04T10:00:00'))
    write(tmp_path, 'x.json', result('families', [-5.0, 5.0, 5.1], machine=xeon, source='chapter 01 at 3bb35aa'))
    write(tmp_path, 'g.json', result('families', [3.0], machine={**EPYC, 'gpu': 'NVIDIA H200'}, measured_on='cuda'))
    tables = {t.title: t for t in summary_tables(load_results(tmp_path))}
    assert list(tables) == ['CPU: AMD AVX2', 'CPU: Intel AVX-512', 'GPU: NVIDIA H200']
    plain, cal = tables['CPU: AMD AVX2'].rows
    assert plain[:6] == ['families', '', '4', '+1.2 %', '+6.0 %', '75 %'] and plain[6] == 'bench at abc1234, 2026-12-04'
    assert cal[:6] == ['families, calibrated', '', '4', '-0.1 %', '-7.5 %', '75 %']   # median of -0.2 and 0.1; the worst error keeps its sign
    assert tables['CPU: Intel AVX-512'].rows[0][5] == '67 %' and tables['CPU: Intel AVX-512'].rows[0][6] == 'chapter 01 at 3bb35aa'   # ±5.0 within, 5.1 not

def test_machine_class_uses_the_gpu_only_for_a_gpu_measurement():
    r = result('families', [1.0], machine={**EPYC, 'gpu': 'NVIDIA H200'})
    assert machine_class(r) == 'CPU: AMD AVX2'
    assert machine_class({**r, 'measured_on': 'cuda'}) == 'GPU: NVIDIA H200'

@pytest.mark.parametrize('text, says', [('{"set": "x", ', 'is not valid JSON'), ('{"set": "x", "machine": {}}', 'it has no rows'),
                                        ('[1, 2]', 'it has no set, machine, rows'),
                                        (json.dumps(result('x', [1.0]) | {'rows': [{'model': 'm', 'batch': 1}]}), 'row 0 lacks')])
def test_a_malformed_file_is_named(tmp_path, text, says):
    write(tmp_path, 'good.json', result('families', [1.0]))
    (tmp_path / 'bad.json').write_text(text)
    with pytest.raises(ValueError, match='bad.json') as e: load_results(tmp_path)
    assert says in str(e.value)

def test_changelog_table_and_a_broken_changelog(tmp_path):
    rows = [dict(round=1, set='families', machine='AMD EPYC, AVX2', found='the heap', fix_commits=['c227d62', '2857ffa'], error_before='-7.5 %', error_after='+0.4 %'),
            dict(round=2, set='unseen', machine='Intel Xeon, AVX-512', found='nothing', fix_commits=[], error_before='+7.0 %', error_after='+7.0 %')]
    (tmp_path / 'changelog.json').write_text(json.dumps(dict(rows=rows)))
    t = changelog_table(tmp_path / 'changelog.json')
    assert t.rows == [['1', 'families', 'AMD EPYC, AVX2', 'the heap', 'c227d62 2857ffa', '-7.5 %', '+0.4 %'], ['2', 'unseen', 'Intel Xeon, AVX-512', 'nothing', '—', '+7.0 %', '+7.0 %']]
    (tmp_path / 'changelog.json').write_text('[]')
    with pytest.raises(ValueError, match='changelog.json is not a changelog'): changelog_table(tmp_path / 'changelog.json')

def test_table_renders_as_escaped_html_and_aligned_text():
    t = ResultTable('CPU: <AVX2>', ['set', 'cases'], [['families', '28'], ['a&b', '3']], note='two')
    h = t._repr_html_()
    assert '<h4>CPU: &lt;AVX2&gt;</h4>' in h and '<td>a&amp;b</td>' in h and h.count('<tr>') == 3 and '<p>two</p>' in h
    assert str(t).splitlines() == ['CPU: <AVX2>', 'set       cases', 'families  28', 'a&b       3', 'two']

def test_the_repository_results_load_and_every_changelog_commit_exists():
    "The stored results of this checkout are all readable, and each changelog row names a set of bench/sets and commits of this history."
    import subprocess
    assert results_dir() == ROOT / 'bench' / 'results' / 'budget_accuracy'
    res = load_results()
    assert {'default', 'families'} <= {r['set'] for r in res} and all(r['rows'] for r in res)
    sys.path.insert(0, str(ROOT / 'bench'))
    from sets import NAMES
    rows = json.loads((results_dir() / 'changelog.json').read_text())['rows']
    assert {r['set'] for r in rows} <= set(NAMES) and len(rows) >= len(NAMES)
    for h in {h for r in rows for h in r['fix_commits']}:
        assert subprocess.run(['git', 'cat-file', '-e', f'{h}^{{commit}}'], cwd=ROOT).returncode == 0, h

def test_what_the_bench_writes_is_what_the_page_reads(tmp_path):
    "bench/budget_accuracy.py's result file (tags, atomic write) round-trips through load_results."
    sys.path.insert(0, str(ROOT / 'bench'))
    import budget_accuracy as B
    r = B.new_result('families', dict(models=['gru']))
    r['rows'].append(dict(model='gru', batch=32, measured=27 * 2**20, planned=28 * 2**20, error_pct=3.7, tensors_only=20 * 2**20))
    path = B.result_path('families', r['machine'], r['options'], tmp_path)
    B.save_result(path, r)
    assert path.name.startswith('families.') and path.name.endswith('.models-gru.json') and [p.name for p in tmp_path.iterdir()] == [path.name]   # no temporary left
    got, = load_results(tmp_path)
    assert got['machine']['isa'] and got['torch'] and got['options']['models'] == ['gru'] and got['rows'][0]['error_pct'] == 3.7
    assert summary_tables([got])[0].title == machine_class(got)
