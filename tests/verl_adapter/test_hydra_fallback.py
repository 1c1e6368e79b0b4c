"""``--override`` syntax without Hydra (the base install): the fallback lexer refuses what
Hydra's own override parser refuses, in Hydra's words, so a value such as ``$(oops)`` never
reaches a written launch script."""
import pytest

from planner.errors import PlanInputError
from planner.extras import available
from planner.verl.export import _hydra_lexer_problem, check_overrides

# (override, Hydra 1.3 accepts it)
CORPUS = [
    ("trainer.x=$(oops)", False), ("trainer.baz='a b'\"c", False), ("a=`ls`", False),
    ("a=x;y", False), ("a=x&y", False), ("a=<x>", False), ("a=#x", False), ("a=!x", False),
    ("a=a~b", False), ("a=a^b", False), ("a=é", False), ("a=f(x)", False),
    ("a=${oc.env:X}", True), ("a=[1,2]", True), ("a={b:1}", True), ("a=x y", True),
    ('a="$(x)"', True), ("a='x'", True), ("a=", True), ("a=null", True), ("a=1e-6", True),
    ("a=/path/to/x.parquet", True), ("a=[/a/b,/c/d]", True), ("a='[\"x\"]'", True),
    ("a=choice(1,2)", True), ("a=x\\,y", True), ("a=http://x:8000/y", True),
    ("a=${x}${y}", True), ('a="a\\"b"', True), ("a=x\ty", True),
]


@pytest.mark.parametrize("override,accepted", CORPUS)
def test_fallback_lexer_agrees_with_the_corpus(override, accepted):
    assert (_hydra_lexer_problem(override) is None) is accepted


@pytest.mark.parametrize("override,accepted", CORPUS)
def test_corpus_is_hydras_own_reading(override, accepted):
    if not available("hydra"):
        pytest.skip("Hydra (the verl extra) is the reference")
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        OverridesParser.create().parse_override(override)
        parsed = True
    except Exception:  # noqa: BLE001 - Hydra's parse errors vary in type
        parsed = False
    assert parsed is accepted


def test_command_substitution_is_refused_by_name(monkeypatch):
    monkeypatch.setattr("planner.verl.export.available", lambda name: False)
    with pytest.raises(PlanInputError, match=r"\$\(oops\).*not valid Hydra syntax"):
        check_overrides(["trainer.x=$(oops)"])
    with pytest.raises(PlanInputError, match="token recognition error at: '`'"):
        check_overrides(["trainer.x=`id`"])
    assert check_overrides(["trainer.total_epochs=5"]) == ["trainer.total_epochs=5"]
