"""The request envelope: a batch body's batch-level fields."""

from __future__ import annotations

import pytest

from prefect_webhooks.envelope import EnvelopeError, batch_envelope


class TestEnvelope:
    def test_reads_batch_level_fields(self) -> None:
        envelope = batch_envelope({"batch": [], "writeKey": "k", "context": {}, "sentAt": "x"})
        assert (envelope.write_key, envelope.sent_at, envelope.messages) == ("k", "x", [])

    @pytest.mark.parametrize("body", [[], {"batch": {}}, {"nobatch": []}, {"batch": [], "context": "x"}])
    def test_refuses_a_body_that_is_not_a_batch(self, body: object) -> None:
        with pytest.raises(EnvelopeError):
            batch_envelope(body)
