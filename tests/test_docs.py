"""Every ```python snippet in docs/*.md and README.md runs, page by page.

The snippets of one page run in order in one namespace (a page may build
on its earlier snippets), with the file's line numbers kept so a failure
points at the doc. Snippets assert what they claim. Relative links in the
pages must point at files that exist.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
#: Pages that must carry runnable code (README and steering.md are checked when present).
OWN_PAGES = ("concepts", "running", "tools", "observers", "providers", "context", "cli", "sessions")
#: Pages whose snippets need an optional extra (mcp needs Python >= 3.10): skipped without it.
NEEDS = {"mcp.md": ("mcp", "mcp_server_time"), "tracing.md": ("opentelemetry.sdk",)}


def snippets(page: Path) -> list[tuple[int, str]]:
    """(first line number, code) of each python block."""
    text = page.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start(1)), m.group(1)) for m in FENCE.finditer(text)]


def test_every_own_page_exists_and_has_runnable_code() -> None:
    for name in OWN_PAGES:
        page = ROOT / "docs" / f"{name}.md"
        assert page.exists(), f"docs/{name}.md is missing"
        assert snippets(page), f"docs/{name}.md has no python snippet"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_snippets_run(page: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if not page.exists():
        pytest.skip(f"{page.name} not written")
    blocks = snippets(page)
    if not blocks:
        pytest.skip(f"{page.name} has no python snippets")
    for module in NEEDS.get(page.name, ()):
        pytest.importorskip(module, reason=f"{page.name} needs {module} (an optional extra)")
    namespace: dict[str, object] = {"__name__": f"docs_{page.stem}"}
    for line, code in blocks:
        exec(compile("\n" * line + code, str(page), "exec"), namespace)  # noqa: S102


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page: Path) -> None:
    if not page.exists():
        pytest.skip(f"{page.name} not written")
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if "://" in target or target.startswith("mailto:"):
            continue
        assert (page.parent / target).exists(), f"{page.name} links to missing {target}"
