"""The documentation's fenced code blocks, as markdown-it-py parses them.

tests/docs/test_docs.py runs the blocks a user is told to run; every other
block carries a marker right before it in the Markdown source,

    <!-- not run: REASON -->

(a diagram, an output sample, a Kubernetes manifest checked by tests/deploy, a
benchmark of minutes), so a new block is either run or consciously marked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[2]
"""The repository root (README.md's commands are run from here)."""

NOT_RUN = re.compile(r"<!--\s*not run:\s*(?P<reason>.*?)\s*-->", re.S)


def doc_files(root: Path = ROOT) -> list[Path]:
    """README.md, docs/*.md and deploy/README.md: the documentation whose blocks are checked."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md")), root / "deploy" / "README.md"]


@dataclass(frozen=True)
class Block:
    """One fenced (or indented) code block.

    ``path`` is relative to the repository root, ``line`` 1-based (the fence's
    line), ``info`` the fence's language ("" if none), ``text`` the content,
    ``not_run`` the marker's reason if the block is marked, else None.
    """

    path: str
    line: int
    info: str
    text: str
    not_run: str | None

    def __str__(self) -> str:
        first = self.text.strip().splitlines()[0] if self.text.strip() else ""
        return f"{self.path}:{self.line} ({self.info or 'no language'}): {first[:70]}"


def blocks(path: Path, root: Path = ROOT) -> list[Block]:
    """Every code block of the Markdown file ``path``, in order, with its marker if it has one.

    The marker is the HTML block immediately before the code block (no other
    block between them).
    """
    tokens = MarkdownIt("commonmark").parse(path.read_text(encoding="utf-8"))
    out = []
    for i, token in enumerate(tokens):
        if token.type not in ("fence", "code_block"):
            continue
        reason = None
        if i > 0 and tokens[i - 1].type == "html_block":
            match = NOT_RUN.search(tokens[i - 1].content)
            reason = match.group("reason") if match else None
        out.append(Block(str(path.relative_to(root)), token.map[0] + 1, token.info.strip(), token.content, reason))
    return out


def all_blocks(root: Path = ROOT) -> list[Block]:
    """The blocks of every file of ``doc_files``."""
    return [b for path in doc_files(root) for b in blocks(path, root)]


def find(path: str, contains: str, root: Path = ROOT) -> Block:
    """The one block of ``path`` whose text contains ``contains``.

    Raises:
        LookupError: no block or several match (the doc changed: update the test with it).
    """
    found = [b for b in blocks(root / path, root) if contains in b.text]
    if len(found) != 1:
        raise LookupError(f"{len(found)} blocks of {path} contain {contains!r} (expected exactly one)")
    return found[0]


def commands(block: Block) -> list[str]:
    """A shell block's commands: its lines, a trailing ``\\`` joining a line to the next;
    blank lines and whole-line comments dropped (a trailing comment stays: the shell ignores it)."""
    out, pending = [], ""
    for line in block.text.splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        line, pending = pending + line, ""
        if line.strip() and not line.lstrip().startswith("#"):
            out.append(line.strip())
    return out
