"The README is generated from nbs/index.ipynb, and its two commands are the ones CI runs."
import re, subprocess, sys
from pathlib import Path
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / 'tools'))
import readme


def test_readme_matches_index_notebook():
    assert (ROOT / 'README.md').read_text() == readme.render(), 'README.md is stale: run `python tools/readme.py`'


def test_readme_has_exactly_two_shell_commands_and_ci_runs_the_test_one():
    cmds = re.findall(r'```sh\n(.*?)\n```', (ROOT / 'README.md').read_text(), re.S)
    main_cmds = [c for c in cmds if not c.startswith('pip install -e ".[dev]" jupyterlab')]
    assert len(main_cmds) == 2, main_cmds
    assert main_cmds[1] in (ROOT / '.ci' / 'run').read_text(), 'CI must run the README test command verbatim'


def test_readme_says_install_chromium_before_the_test_command_and_how_long_it_takes():
    "Issue 37: a reader following the README in order has a browser before the command that needs one, and knows the wait."
    text = (ROOT / 'README.md').read_text()
    test_cmd = text.index('```sh\npip install -e ".[dev]" && nbdev-test && pytest\n```')
    assert text.index('apt-get install chromium') < test_cmd and text.index('NETLITE_CHROMIUM') < test_cmd
    after = text[test_cmd:].split('\n\n')[1]  # the paragraph right after the command
    assert re.search(r'\d+ minutes', after) and '2-core' in after, after
