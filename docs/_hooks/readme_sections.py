"""MkDocs hook: a page includes sections of the README, so that they are written once.

In the README a section is the text between the lines ``<!-- section: NAME -->`` and ``<!-- /section: NAME -->``;
in a page the line ``<!-- readme: NAME -->`` becomes that text. Links into ``docs/`` are rewritten relative to the
page (the pages that include sections lie in ``docs/`` itself), so ``[Attacks](docs/attacks.md)`` works on GitHub
and on the site. An unknown or unclosed section stops the build.
"""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
INCLUDE = re.compile(r"^<!-- readme: ([\w-]+) -->$", re.M)


def readme_section(name: str, text: str | None = None) -> str:
    """The README's section ``name``, its links into ``docs/`` made relative to ``docs/``."""
    text = README.read_text(encoding="utf-8") if text is None else text
    start, end = f"<!-- section: {name} -->\n", f"<!-- /section: {name} -->"
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise ValueError(f"README.md has no single section {name!r} (between {start.strip()!r} and {end!r})")
    body = text.split(start, 1)[1].split(end, 1)[0]
    return re.sub(r"\]\(docs/", "](", body)


def on_page_markdown(markdown: str, page, config, files) -> str:
    """MkDocs' hook: replace each ``<!-- readme: NAME -->`` line of a page by the README's section NAME."""
    if "<!-- readme: " not in markdown:
        return markdown
    if page.file.src_uri.count("/"):
        raise ValueError(f"{page.file.src_uri}: only pages at the top of docs/ include README sections")
    text = README.read_text(encoding="utf-8")
    return INCLUDE.sub(lambda m: readme_section(m.group(1), text).rstrip("\n"), markdown)
