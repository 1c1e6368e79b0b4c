"""The README's example outputs are what the commands print today."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import readme_examples  # noqa: E402

pytestmark = pytest.mark.needs("verl")  # one example is `validate`


def test_examples_are_found_with_their_elisions():
    found = readme_examples.examples(readme_examples.README.read_text())
    commands = [example.argv[0] for example in found]
    assert len(found) >= 4 and "estimate" in commands and "validate" in commands
    assert any(example.shape() is not None for example in found)


def test_an_elided_block_keeps_its_first_and_last_lines():
    example = readme_examples.Example("$ plan-parallel gpus", "a\n...\nz\n", 0, 0)
    assert readme_examples.rendered(example, "a\nb\nc\nz\n") == "a\n...\nz\n"
    assert readme_examples.rendered(example, "a\nz\n") == "a\nz\n"


def test_readme_examples_are_current(capsys):
    assert readme_examples.main(["--check"]) == 0, capsys.readouterr().out
