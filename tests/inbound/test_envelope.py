"""The request envelope: a batch body's batch-level fields."""

from __future__ import annotations

import pytest

from prefect_webhooks.inbound.envelope import EnvelopeError, batch_envelope, merge_batch_fields


class TestEnvelope:
    def test_reads_batch_level_fields(self) -> None:
        envelope = batch_envelope({"batch": [], "writeKey": "k", "context": {}, "sentAt": "x"})
        assert (envelope.write_key, envelope.sent_at, envelope.messages) == ("k", "x", [])

    @pytest.mark.parametrize("body", [[], {"batch": {}}, {"nobatch": []}, {"batch": [], "context": "x"}])
    def test_refuses_a_body_that_is_not_a_batch(self, body: object) -> None:
        with pytest.raises(EnvelopeError):
            batch_envelope(body)


class TestMergeBatchFields:
    def test_the_calls_own_values_win_key_by_key(self) -> None:
        merged = merge_batch_fields(
            {"context": {"ip": "1", "integrations": {"A": False}}, "integrations": {"B": False}},
            context={"ip": "0", "locale": "x", "integrations": {"A": True, "C": True}},
            integrations={"B": True, "D": True},
            sent_at="s",
        )
        assert merged == {
            "context": {"ip": "1", "locale": "x", "integrations": {"A": False, "C": True}},
            "integrations": {"B": False, "D": True},
            "sentAt": "s",
        }

    @pytest.mark.parametrize("own", [[None], "x", 1, True, []])
    def test_a_calls_own_context_that_is_not_an_object_stays_for_validation(self, own: object) -> None:
        merged = merge_batch_fields({"context": own}, context={"integrations": {"All": False}})
        assert merged["context"] == own
