"""The locked validation split (benchmarks/data/LOCKED.md) is what its rule gives, and holds no
source the model was tuned to before issue 25."""

from __future__ import annotations

import json

from benchmarks import lock_split


def test_the_written_split_is_the_rule_s():
    written = json.loads(lock_split.LOCKED.read_text())
    assert written["sources"] == lock_split.locked_sources(), \
        "a corpus file was added or changed: run python -m benchmarks.lock_split --write"
    assert written["rule"] == lock_split.RULE


def test_no_earlier_source_is_locked_and_a_third_are():
    written = set(json.loads(lock_split.LOCKED.read_text())["sources"])
    earlier = {k for f in lock_split.EARLIER_FILES for k in lock_split._keys(f)}
    assert not written & earlier
    first = {k for f in lock_split.CANDIDATE_FILES for k in lock_split._keys(f)} - earlier
    # the walk locked a third of all sources of its day (28), from the first growth's
    # candidates; one of them (a second transcription of development records) was removed
    assert len(written) >= 28 and len(written & first) >= 27
    # each first-growth file keeps a development source
    for f in lock_split.CANDIDATE_FILES:
        assert set(lock_split._keys(f)) - written


def test_later_files_lock_by_the_digest_rule():
    keys = [f"source {i} | stack" for i in range(64)]
    share = sum(lock_split.later_locked(k) for k in keys) / len(keys)
    assert 0.2 < share < 0.6
    assert lock_split.later_locked("x") == (int(lock_split.digest("x")[0], 16) < 6)


def test_sources_whose_residuals_were_read_stay_in_development():
    # an issue's stated residual, or an intake check run before the rule was applied: locking
    # them would measure nothing (LOCKED.md)
    for prefix in lock_split.SEEN_IN_ISSUES + lock_split.SEEN_AT_INTAKE:
        assert not lock_split.later_locked(prefix + " (any commit) | any stack")
    new1 = set(lock_split._keys("published_runs_new1.json"))
    assert len(new1) == 3 and any(int(lock_split.digest(k)[0], 16) < 6 for k in new1)
    assert not new1 & set(lock_split.locked_sources())


def test_accuracy_refuses_a_written_split_that_lacks_a_locked_source(monkeypatch):
    """A new corpus file's locked sources must be written before anything is estimated: the
    accuracy run refuses (naming the fix) rather than estimate them as development sources."""
    import pytest

    from benchmarks import accuracy

    extra = "a source the rule locks but the file does not list"
    monkeypatch.setattr(lock_split, "locked_sources",
                        lambda: sorted([*json.loads(lock_split.LOCKED.read_text())["sources"],
                                        extra]))
    with pytest.raises(SystemExit, match=r"lacks 1 source.*lock_split --write"):
        accuracy.main(["--cv", "source"])
