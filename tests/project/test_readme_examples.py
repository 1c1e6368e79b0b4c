"""The example outputs of the README and the docs site are what the commands print today."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import readme_examples  # noqa: E402

pytestmark = pytest.mark.needs("verl")  # validate, fix and diff examples


def test_examples_are_found_with_their_elisions():
    found = {path: readme_examples.examples(path.read_text())
             for path in readme_examples.documents()}
    readme = found.pop(readme_examples.README)
    # the README: five commands with short outputs
    assert len(readme) == 5 and any(example.shape() is not None for example in readme)
    assert {example.argv[0] for example in readme} >= {"estimate", "validate", "explain"}
    docs = [example for examples in found.values() for example in examples]
    commands = {example.argv[0] for example in docs if not example.is_benchmark}
    assert {"estimate", "explain", "validate", "fix", "diff", "profile", "models",
            "gpus"} <= commands
    # the accuracy tables are benchmarks' output, the minutes-long ones stored with their date
    benchmarks = {example.argv[0]: example for example in docs if example.is_benchmark}
    assert {"benchmarks/accuracy.py", "benchmarks/async_accuracy.py",
            "benchmarks/memory_anchors.py"} <= set(benchmarks)
    assert benchmarks["benchmarks/accuracy.py"].stored_on is not None
    assert benchmarks["benchmarks/async_accuracy.py"].stored_on is None


def test_an_elided_block_keeps_its_first_and_last_lines():
    example = readme_examples.Example("$ plan-parallel gpus", "a\n...\nz\n", 0, 0)
    assert readme_examples.rendered(example, "a\nb\nc\nz\n") == "a\n...\nz\n"
    assert readme_examples.rendered(example, "a\nz\n") == "a\nz\n"


def test_a_stored_output_gets_the_date_it_changed(monkeypatch):
    text = "```text\n$ python benchmarks/x.py --rl  # stored 2000-01-01\nold\n```\n"
    (example,) = readme_examples.examples(text)
    assert example.is_benchmark and example.argv == ["benchmarks/x.py", "--rl"]
    assert example.stored_on == "2000-01-01"
    # skipped: left alone, stale or not
    assert readme_examples.regenerate(text, "t", skip_stored=True) == (text, [])
    monkeypatch.setattr(readme_examples, "output_of", lambda example: "new\n")
    new, diffs = readme_examples.regenerate(text, "t")
    assert len(diffs) == 1 and "new\n```" in new and "stored 2000-01-01" not in new
    assert readme_examples.regenerate(new, "t") == (new, [])  # unchanged: the date stays


def test_only_benchmark_scripts_run():
    with pytest.raises(SystemExit, match="not a script under benchmarks/"):
        readme_examples.run_benchmark(["tests/conftest.py"])


def test_readme_and_docs_examples_are_current(capsys):
    assert readme_examples.main(["--check", "--skip-stored"]) == 0, capsys.readouterr().out
