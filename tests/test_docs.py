"""Every Python block in docs/*.md and README.md runs, or says why not.

A ```python (or ```py) block runs on its own, in a fresh namespace, unless
its first line says it continues the blocks above it (``# continues ...``):
then it runs in theirs, so a reader is told when a block needs the ones
before it. A block whose first line is ``# fragment: <why>`` is not run,
and says why. The file's line numbers are kept so a failure points at the
doc. Blocks assert what they claim. Every fence names its language.
Relative links in the pages must point at files that exist.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
FENCE = re.compile(r"^```(?:python|py)[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
#: Any fenced block: its language tag and its body.
ANY_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.S | re.M)
CONTINUES = re.compile(r"#\s*continues\b", re.I)
FRAGMENT = re.compile(r"#\s*fragment:\s*(\S.{10,})", re.I)
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
#: Pages that must carry runnable code (README and steering.md are checked when present).
OWN_PAGES = ("quickstart", "concepts", "running", "tools", "observers", "providers", "context", "cli", "sessions")
#: Pages whose snippets need an optional extra (mcp needs Python >= 3.10): skipped without it.
NEEDS = {"mcp.md": ("mcp", "mcp_server_time"), "tracing.md": ("opentelemetry.sdk",), "quickstart.md": ("flask",)}


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
    # What the blocks above defined; a block that continues them runs in it.
    above: dict[str, object] = {"__name__": f"docs_{page.stem}"}
    for line, code in blocks:
        first = code.lstrip().split("\n", 1)[0]
        if FRAGMENT.match(first):
            continue
        namespace = above if CONTINUES.match(first) else {"__name__": f"docs_{page.stem}"}
        exec(compile("\n" * line + code, str(page), "exec"), namespace)  # noqa: S102
        above.update(namespace)


def test_every_block_names_its_language_and_every_python_block_runs_or_says_why() -> None:
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for m in ANY_FENCE.finditer(text):
            where = f"{page.name}:{text.count(chr(10), 0, m.start()) + 1}"
            lang = m.group(1).strip()
            assert lang in ("python", "py", "text", "bash"), f"{where}: a fence without a known language"
            first = m.group(2).lstrip().split("\n", 1)[0]
            if first.lower().startswith("# fragment"):
                assert FRAGMENT.match(first), f"{where}: a fragment must say why it is not run"
                assert lang in ("python", "py"), f"{where}: only code blocks are fragments"
    readme = snippets(ROOT / "README.md")
    assert readme and not [c for _, c in readme if FRAGMENT.match(c.lstrip())], "the README's blocks all run"


def test_the_readme_set_up_installs_only_what_the_demo_needs_then_the_test_extra() -> None:
    import shlex
    import subprocess
    import sys

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    setup = re.search(r"^## Set-up.*?^```bash\n(.*?)^```", text, re.S | re.M)
    assert setup is not None
    first, second = setup.group(1).strip().splitlines()
    assert first == 'pip install -e . && loopctl run "What is 12 + 30?"'
    assert second == "pip install -e '.[test]' && python -m pytest"
    # The demo itself, as the first command runs it, needs none of the test extra.
    argv = shlex.split(first.split("&&", 1)[1])[1:]
    probe = (
        "import sys\n"
        "from loopctl.demo.cli import main\n"
        f"code = main({argv!r})\n"
        "extra = {'pytest', 'hypothesis', 'mypy', 'flask', 'django', 'pexpect', 'celery', 'redis',\n"
        "         'selenium', 'opentelemetry', 'mcp'}\n"
        "print('LOADED', sorted(extra & {m.split('.')[0] for m in sys.modules}))\n"
        "sys.exit(code)\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], cwd=str(ROOT), capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert "12 + 30 = 42." in proc.stdout
    assert "LOADED []" in proc.stdout, proc.stdout


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page: Path) -> None:
    if not page.exists():
        pytest.skip(f"{page.name} not written")
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if "://" in target or target.startswith("mailto:"):
            continue
        assert (page.parent / target).exists(), f"{page.name} links to missing {target}"


def test_every_environment_variable_read_is_listed_in_one_place() -> None:
    read = re.compile(r"""(?:environ\.get|env\.get|getenv)\(\s*["']([A-Z][A-Z0-9_]+)["']""")
    names: set[str] = set()
    for path in [*(ROOT / "loopctl").rglob("*.py"), *(ROOT / "examples").rglob("*.py")]:
        names.update(read.findall(path.read_text(encoding="utf-8")))
    from loopctl.demo import clients, wording

    names.update(var for var, _ in clients._DEFAULT_MODELS.values())
    names.update(v for _, *env in wording.PROVIDER_ENV.values() for v in env)
    text = (ROOT / "docs" / "running.md").read_text(encoding="utf-8")
    section = text.split("## Environment variables", 1)[1]
    assert {"OPENAI_API_KEY", "ANTHROPIC_API_KEY", "LOOPCTL_REDIS_URL"} <= names
    missing = sorted(n for n in names if f"`{n}`" not in section)
    assert not missing, f"not listed under running.md's Environment variables: {missing}"
