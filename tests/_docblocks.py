"""Extract the ```python blocks of README.md and every page under docs/ (guides included), with their small-size directives.

A block runs as written. A block too long for the test suite may be preceded (on
the line just above its opening fence, blank lines allowed) by an HTML comment,
invisible on the rendered page::

    <!-- doc-test small: 100_000 => 5_000 | 2000, => 300, -->

Each ``OLD => NEW`` pair is a literal substitution applied when small sizes are
requested (environment variable ``JAXSUB_DOCS_SIZE=small``, the default of
``tests/test_docs.py``; ``JAXSUB_DOCS_SIZE=as_written`` runs every block
verbatim). Every ``OLD`` must occur in the block, so a directive that no longer
matches fails instead of silently running the full size. ``<!-- doc-test skip: reason -->``
skips a block (say why: e.g. it needs 8 devices or a dataset file).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
SIZE_ENV = "JAXSUB_DOCS_SIZE"

_FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
_DIRECTIVE = re.compile(r"<!--\s*doc-test\s+(small|skip)\s*:(.*?)-->\s*$", re.S)


class DocBlock(NamedTuple):
    path: Path
    line: int  # 1-based line of the opening fence
    code: str  # as written
    small: tuple[tuple[str, str], ...]  # substitutions for small sizes
    skip: str | None  # reason, when skipped

    @property
    def id(self) -> str:
        path = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path
        return f"{path}:{self.line}"

    def source(self, size: str | None = None) -> str:
        """The code to run: as written, or with the small-size substitutions applied."""
        size = size or os.environ.get(SIZE_ENV, "small")
        if size not in ("small", "as_written"):
            raise ValueError(f"{SIZE_ENV} must be 'small' or 'as_written'; got {size!r}")
        code = self.code
        if size == "small":
            for old, new in self.small:
                if old not in code:
                    raise AssertionError(
                        f"{self.id}: doc-test directive {old!r} => {new!r} matches nothing in the block"
                    )
                code = code.replace(old, new)
        return code


def _directive_before(text: str, start: int):
    before = text[:start].rstrip()
    opening = before.rfind("<!--")
    match = _DIRECTIVE.match(before, opening) if opening >= 0 else None
    if match is None or match.end() != len(before):
        return (), None
    kind, body = match.group(1), match.group(2).strip()
    if kind == "skip":
        return (), body or "no reason given"
    pairs = []
    for item in body.split("|"):
        old, sep, new = item.partition("=>")
        if not sep:
            raise ValueError(f"bad doc-test directive {item!r}: expected 'OLD => NEW'")
        pairs.append((old.strip(), new.strip()))
    return tuple(pairs), None


def python_blocks(path: Path) -> list[DocBlock]:
    text = Path(path).read_text()
    blocks = []
    for match in _FENCE.finditer(text):
        small, skip = _directive_before(text, match.start())
        line = text.count("\n", 0, match.start()) + 1
        blocks.append(DocBlock(Path(path), line, match.group(1), small, skip))
    return blocks


def doc_files() -> list[Path]:
    """README.md and every Markdown page under docs/ (docs/guides/, docs/api/, ... included)."""
    return [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))


def all_blocks() -> list[DocBlock]:
    return [block for path in doc_files() for block in python_blocks(path)]
