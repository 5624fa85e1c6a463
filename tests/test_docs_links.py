"""Every relative link in README.md, BUILD.md and docs/ names a file that
exists and, after '#', a heading of that file (GitHub's anchor rule)."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / 'README.md', ROOT / 'BUILD.md',
             *sorted((ROOT / 'docs').glob('*.md')),
             ROOT / 'benchmarks' / 'README.md']
LINK = re.compile(r'\]\(([^)\s]+)\)')


def anchor(heading):
    """GitHub's anchor of a Markdown heading's text."""
    text = re.sub(r'[^\w\- ]', '', heading.strip().lower())
    return text.replace(' ', '-')


def anchors(path):
    """The anchors of every heading of `path`, outside code blocks."""
    found, in_code = set(), False
    for line in path.read_text().splitlines():
        if line.startswith('```'):
            in_code = not in_code
        elif not in_code and line.startswith('#'):
            found.add(anchor(line.lstrip('#')))
    return found


def test_anchor_rule():
    assert anchor(' The demo (`make demo`)') == 'the-demo-make-demo'
    assert anchor(' Uncurated unlabeled images: RoPAWS') == (
        'uncurated-unlabeled-images-ropaws')


@pytest.mark.parametrize('document', DOCUMENTS,
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(document):
    broken = []
    for target in LINK.findall(document.read_text()):
        if re.match(r'[a-z]+:', target):
            continue  # https:, mailto:
        name, _, fragment = target.partition('#')
        path = (document.parent / name).resolve() if name else document
        if not path.exists():
            broken.append(f'{target}: no file {path}')
        elif fragment and path.suffix == '.md' and (
                fragment not in anchors(path)):
            broken.append(f'{target}: no heading #{fragment} in {path.name}')
    assert not broken, '\n'.join(broken)
