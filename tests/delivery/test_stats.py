"""A delivering run's counts as a person reads them in serve's console and a run's log."""

from __future__ import annotations

from prefect_webhooks.delivery.endpoints.stats import DeliveryStats, summary_in_words


def test_counts_in_words_leave_out_zeros_and_never_show_a_dict() -> None:
    stats = DeliveryStats(delivered=3, rescheduled=8, batches=2)
    assert stats.in_words() == "3 delivered, 8 to be retried in 2 batches"
    assert summary_in_words({"delivered": 1200, "failed": 1, "rescheduled": 0, "filtered": 4, "batches": 1}) == (
        "1,200 delivered, 1 failed, 4 filtered in 1 batch")
    assert DeliveryStats().in_words() == "no message due"
    assert DeliveryStats(batches=3).in_words() == "nothing sent in 3 batch(es)"
