"""The docs site: it builds in strict mode, every page is in the nav, the README stays short,
the exit codes are described once and match the code, and the CLI reference is current."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import cli_reference  # noqa: E402

from planner.cli.codes import ExitCode  # noqa: E402

DOCS = REPO / "docs"


def nav_pages(entries) -> list[str]:
    pages = []
    for entry in entries:
        if isinstance(entry, str):
            pages.append(entry)
        elif isinstance(entry, dict):
            for value in entry.values():
                pages += nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_every_page_is_in_the_nav_once():
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    pages = nav_pages(config["nav"])
    assert len(pages) == len(set(pages))
    on_disk = {str(path.relative_to(DOCS)) for path in DOCS.rglob("*.md")}
    assert set(pages) == on_disk


def test_readme_is_short_and_links_into_the_docs():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    links = re.findall(r"\]\((docs/[^)#]+)", text)
    assert len(links) >= 10
    for link in links:
        assert (REPO / link).exists(), link


def test_exit_codes_are_described_once_and_match_the_code():
    security = (DOCS / "security.md").read_text()
    table = security.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    documented = {int(code) for code in re.findall(r"^\| (\d+) \|", table, re.MULTILINE)}
    assert documented == {int(code) for code in ExitCode}
    # no other page or the README has its own list of them
    for path in [REPO / "README.md", *DOCS.rglob("*.md")]:
        if path.name in ("security.md", "cli.md"):
            continue
        assert not re.search(r"exit codes?:? *\d", path.read_text(), re.IGNORECASE), path


def test_cli_reference_is_current(capsys):
    assert cli_reference.main(["--check"]) == 0, capsys.readouterr().out


def test_cli_reference_covers_every_command_and_flag():
    from planner.cli.args import SUBCOMMANDS, build_parser

    page = (DOCS / "reference" / "cli.md").read_text()
    parser = build_parser()
    (sub,) = [action for action in parser._actions if hasattr(action, "choices")
              and isinstance(action.choices, dict)]
    for name in SUBCOMMANDS:
        section = page.split(f"\n## {name}\n", 1)[1].split("\n## ", 1)[0]
        for action in sub.choices[name]._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}" in section or f", {flag}" in section, (name, flag)


@pytest.mark.needs("docs")
def test_site_builds_in_strict_mode(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site"),
         "--config-file", str(REPO / "mkdocs.yml")],
        cwd=REPO, capture_output=True, text=True, env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
        timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").is_file()
    assert (tmp_path / "site" / "guide" / "plan" / "index.html").is_file()
