"""The front door: a README a newcomer reads in five minutes, whose links and commands work.

The commands themselves run elsewhere: ``.ci/run`` runs the test command on a fresh clone,
``tests/jobs/test_demo.py`` runs ``mhnotebook demo``; here, that the README still says them
exactly, that its links lead somewhere, and that every guide is on the site.
"""

from __future__ import annotations

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO = 'python3 -m venv .venv && . .venv/bin/activate && pip install -e . && mhnotebook demo'
TESTS = (
    'python3 -m venv .venv && . .venv/bin/activate && '
    "pip install uv && uv pip install --compile-bytecode -e '.[test]' && pytest"
)


def _read(*path: str) -> str:
    with open(os.path.join(ROOT, *path), encoding='utf-8') as f:
        return f.read()


def test_the_readme_is_short_and_says_both_commands_exactly():
    readme = _read('README.md')
    assert len(readme.splitlines()) <= 150
    blocks = re.findall(r'```bash\n(.*?)```', readme, re.S)
    assert [DEMO] in [b.strip().splitlines() for b in blocks]
    assert [TESTS] in [b.strip().splitlines() for b in blocks]
    assert not readme.splitlines()[2].startswith('[!['), 'no badge before the first words'
    # CI runs the README's test command: the same install and the same pytest.
    ci = _read('.ci', 'run')
    assert "pip install -q uv && uv pip install -q --compile-bytecode -e '.[test]'" in ci
    assert 'pytest "${@:2}"' in ci


def test_every_relative_link_of_the_front_pages_leads_to_a_file():
    for page in ('README.md', 'CONTRIBUTING.md'):
        text = _read(page)
        targets = re.findall(r'\]\(([^)#:]+)(?:#[^)]*)?\)', text)
        targets += re.findall(r'<img src="([^"]+)"', text)
        assert targets, page
        for target in targets:
            assert os.path.exists(os.path.join(ROOT, target)), f'{page} links to {target}'


def test_every_guide_is_on_the_site_and_links_between_guides_resolve():
    index = _read('docs', 'index.md')
    folder = os.path.join(ROOT, 'docs', 'guides')
    guides = sorted(f for f in os.listdir(folder) if f.endswith('.md'))
    assert len(guides) == 5
    for guide in guides:
        assert f'guides/{guide[:-3]}\n' in index, f'{guide} is not in docs/index.md'
        text = _read('docs', 'guides', guide)
        for target in re.findall(r'\]\(([^)#:]+)(?:#[^)]*)?\)', text):
            path = os.path.join(ROOT, 'docs', 'guides', target)
            assert os.path.exists(path), f'{guide} links to {target}'
    assert '{include} ../README.md' not in index, 'the home page is its own, not the README'
