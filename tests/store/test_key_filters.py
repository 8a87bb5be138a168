"""Bloom filters over remembered keys: no key missed, few claimed, and a set of them tested together."""

from __future__ import annotations

from prefect_webhooks.store.dedupe.seen_ids import message_key
from prefect_webhooks.store.log.key_filters import FilterSet, KeyFilter, Probe


def test_the_filter_never_misses_a_key_and_rarely_claims_one() -> None:
    held = [message_key("web", f"held-{n}") for n in range(100_000)]
    others = [message_key("web", f"other-{n}") for n in range(100_000)]
    built = KeyFilter.from_bytes(KeyFilter.of_keys(held).to_bytes())
    assert built.may_hold(Probe(held)) == list(range(len(held)))
    assert len(built.may_hold(Probe(others))) < 100  # at most about 1 in 2,000
    assert len(built.to_bytes()) == 1 + 2**21 // 8  # 1.6M bits rounded up to a power of two


def test_a_set_of_filters_tested_together_answers_as_each_one_alone() -> None:
    filters = {f"p{n}": KeyFilter.of_keys([message_key("web", f"{n}-{i}") for i in range(size)])
               for n, size in enumerate((3000, 3000, 3000, 40_000, 10))}
    together = FilterSet()
    for name, kept in filters.items():
        together.add(name, kept)
    keys = [message_key("web", f"{n}-{i}") for n in (0, 3, 4) for i in (5, 7)] + [
        message_key("web", f"new-{i}") for i in range(5000)]
    expected = {name: kept.may_hold(Probe(keys)) for name, kept in filters.items()}
    assert together.candidates(Probe(keys)) == {name: hits for name, hits in expected.items() if hits}
    assert {name: hits[:2] for name, hits in expected.items() if name in ("p0", "p3", "p4")} == {
        "p0": [0, 1], "p3": [2, 3], "p4": [4, 5]}
    together.discard("p3")
    assert "p3" not in together.candidates(Probe(keys)) and "p0" in together.candidates(Probe(keys))
