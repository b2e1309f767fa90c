"""A corpus of Dask scripts nobody here wrote: the examples of Dask's own documentation.

The documentation pages ship in the sdists of ``dask`` and ``distributed`` on PyPI (no
notebook of the Dask tutorial or examples is on a package registry, and CI reaches nothing
else). :func:`page_script` turns a page into the script a user gets by copying its examples
into a file, in page order, with these rules and no others:

1. Code comes from ``.. code-block:: python`` / ``ipython`` blocks and ``>>>`` examples.
2. Where a page offers tabs (``tab-set``), the reader keeps the first tab selected.
3. Doctest output is dropped; so is a ``...`` line that is no Python (elided output).
4. A statement that needs what this machine lacks is dropped, and listed: graphviz
   (``.visualize(``), a scheduler at an address (``Client("...")``), IPython magics.
5. The script's body goes under ``if __name__ == "__main__":``, as users learn they must
   for process-based clusters, and starts with ``client = Client()`` (the documentation's own
   advice for using the distributed scheduler) unless the page's first example makes one.
"""

from __future__ import annotations

import ast
import doctest
import glob
import os
import re
import subprocess
import sys
import tarfile
import textwrap
from dataclasses import dataclass, field

import dask
import distributed

CACHE = os.path.join(os.path.expanduser("~"), ".cache", "metacollect-test-corpus")

#: statements dropped by rule 4, with why
UNAVAILABLE = {
    r"\.visualize\(": "needs graphviz",
    r"Client\(\s*['\"]": "needs a scheduler at that address",
    r"^\s*%": "IPython magic",
}


@dataclass
class Script:
    page: str
    source: str
    dropped: list[str] = field(default_factory=list)


def sdist(name: str, version: str) -> str:
    """The sdist of an installed package, downloaded once into :data:`CACHE`."""
    os.makedirs(CACHE, exist_ok=True)
    found = glob.glob(os.path.join(CACHE, f"{name}-{version}.tar.gz"))
    if found:
        return found[0]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:"]
    out = subprocess.run(
        [*cmd, "-d", CACHE, f"{name}=={version}"], capture_output=True, text=True, check=False
    )
    found = glob.glob(os.path.join(CACHE, f"{name}-{version}.tar.gz"))
    if out.returncode or not found:
        raise RuntimeError(
            f"cannot download the {name} {version} sdist from PyPI ({out.stderr.strip()[-200:]}); "
            f"give this machine access to PyPI or put {name}-{version}.tar.gz into {CACHE}"
        )
    return found[0]


def page_text(package: str, page: str) -> str:
    """The text of ``docs/source/PAGE`` in the installed version's sdist of ``package``."""
    version = {"dask": dask.__version__, "distributed": distributed.__version__}[package]
    with tarfile.open(sdist(package, version)) as tar:
        member = tar.extractfile(f"{package}-{version}/docs/source/{page}")
        if member is None:
            raise FileNotFoundError(f"{page} is not in the {package} {version} sdist")
        return member.read().decode()


def _blocks(text: str) -> list[str]:
    """The page's code blocks in order, only the first tab of each tab-set (rules 1, 2)."""
    lines = text.splitlines()
    blocks, i, skip_indent = [], 0, None
    while i < len(lines):
        line = lines[i]
        indent = len(line) - len(line.lstrip())
        if skip_indent is not None and line.strip() and indent <= skip_indent:
            skip_indent = None
        tab = re.match(r"\s*\.\. tab-item::", line)
        if tab and skip_indent is None and _is_later_tab(lines, i):
            skip_indent = indent
        block = re.match(r"(\s*)\.\. code-block::\s*(python|ipython|pycon)\s*$", line)
        if block and skip_indent is None:
            body, i = _indented_body(lines, i + 1, len(block.group(1)))
            blocks.append(body)
            continue
        i += 1
    return blocks


def _is_later_tab(lines: list[str], i: int) -> bool:
    """Whether the tab-item at line ``i`` follows another tab of the same tab-set."""
    indent = len(lines[i]) - len(lines[i].lstrip())
    for j in range(i - 1, -1, -1):
        text = lines[j]
        if not text.strip():
            continue
        k = len(text) - len(text.lstrip())
        if k < indent:
            return False  # reached the tab-set itself
        if k == indent and text.lstrip().startswith(".. tab-item::"):
            return True
    return False


def _indented_body(lines: list[str], i: int, indent: int) -> tuple[str, int]:
    body = []
    while i < len(lines) and (
        not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent
    ):
        body.append(lines[i])
        i += 1
    text = textwrap.dedent("\n".join(body)).strip("\n")
    return "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith(":")), i


def _statements(block: str) -> list[str]:
    """The block's source: doctest examples without output (rule 3), or the code as is."""
    if ">>>" not in block:
        return [block]
    out = []
    for example in doctest.DocTestParser().get_examples(block):
        source = example.source
        while source and not _compiles(source):  # a "..." output line taken for code
            source = "\n".join(source.rstrip("\n").splitlines()[:-1]) + "\n"
        if source.strip():
            out.append(source.rstrip("\n"))
    return out


def _compiles(source: str) -> bool:
    try:
        ast.parse(source)
    except SyntaxError:
        return False
    return True


def page_script(package: str, page: str) -> Script:
    """The script a user makes of ``page``'s examples (see the module docstring)."""
    script = Script(page=f"{package}/{page}", source="")
    kept = []
    for block in _blocks(page_text(package, page)):
        for statement in _statements(block):
            why = next((w for rx, w in UNAVAILABLE.items() if re.search(rx, statement, re.M)), None)
            if why:
                script.dropped.append(f"{statement.strip()}  ({why})")
            elif _compiles(statement):
                kept.append(statement)
    if not kept or "Client(" not in kept[0]:
        kept.insert(0, "from dask.distributed import Client\nclient = Client()")
    body = "\n".join(kept)
    script.source = 'if __name__ == "__main__":\n' + textwrap.indent(body, "    ") + "\n"
    return script
