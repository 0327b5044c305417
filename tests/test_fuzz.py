"""Bounded, seeded fuzzing of every parser and command input (tests/fuzz_cases.py).

Every input must end in the project's own error or in a result that passes the target's
checks: no crash, no hang, no silent accept. benchmarks/fuzz_long.py runs the same targets
on 10,000+ inputs; the counts here keep CI within a minute or two.
"""

import pytest

from fuzz_cases import TARGETS, build_corpus, run_one

# inputs per target in CI; the cheap parsers get more
COUNTS = {"header": 60, "index": 25, "config": 40, "config_field": 40, "manifest": 25, "converted_shard": 20,
          "source_shard": 8, "resume": 8, "load_flip": 12, "cli": 25}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return build_corpus(tmp_path_factory.mktemp("fuzz"))


def test_every_target_is_counted():
    assert set(COUNTS) == set(TARGETS)


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_fuzz_target(corpus, target):
    bad = []
    kinds = {}
    for seed in range(COUNTS[target]):
        o = run_one(corpus, target, seed)
        kinds[o.kind] = kinds.get(o.kind, 0) + 1
        if o.kind in ("crash", "hang", "silent"):
            bad.append(f"{o.kind}: {o.detail}")
    assert not bad, "\n".join(bad)
    # the mutators must reach both sides of every parser
    assert kinds.get("refused", 0) > 0, kinds
