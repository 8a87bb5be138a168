from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prefect_webhooks.messages.timestamps import TimestampError, format_timestamp, parse_timestamp

UTC = timezone.utc


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024-03-05T10:20:30Z", datetime(2024, 3, 5, 10, 20, 30, tzinfo=UTC)),
        ("2024-03-05T10:20:30+00:00", datetime(2024, 3, 5, 10, 20, 30, tzinfo=UTC)),
        ("2024-03-05T10:20:30-0800", datetime(2024, 3, 5, 18, 20, 30, tzinfo=UTC)),
        ("2024-03-05T10:20:30+05:30", datetime(2024, 3, 5, 4, 50, 30, tzinfo=UTC)),
        ("2024-03-05T10:20:30.1Z", datetime(2024, 3, 5, 10, 20, 30, 100000, tzinfo=UTC)),
        ("2024-03-05T10:20:30.123Z", datetime(2024, 3, 5, 10, 20, 30, 123000, tzinfo=UTC)),
        ("2024-03-05T10:20:30.123456789Z", datetime(2024, 3, 5, 10, 20, 30, 123456, tzinfo=UTC)),
        ("2024-03-05T10:20Z", datetime(2024, 3, 5, 10, 20, tzinfo=UTC)),
        ("2024-03-05T10:20:30", datetime(2024, 3, 5, 10, 20, 30, tzinfo=UTC)),
    ],
)
def test_parses_every_iso_8601_form_we_accept(text: str, expected: datetime) -> None:
    assert parse_timestamp(text) == expected


@pytest.mark.parametrize(
    "text", ["", "yesterday", "2024-13-01T00:00:00Z", "2024-03-05T25:00:00Z", "2024-03-05T10:20:30+99:00"]
)
def test_rejects_what_is_not_a_timestamp(text: str) -> None:
    with pytest.raises(TimestampError):
        parse_timestamp(text)


def test_outbound_format_is_utc_milliseconds_with_z() -> None:
    value = datetime(2024, 3, 5, 10, 20, 30, 123999, tzinfo=timezone(timedelta(hours=-8)))
    assert format_timestamp(value) == "2024-03-05T18:20:30.123Z"
    assert format_timestamp(datetime(2024, 3, 5)) == "2024-03-05T00:00:00.000Z"
    # Historical imports: years before 1000 keep four digits, as ISO 8601 wants.
    assert format_timestamp(datetime(999, 1, 2, 3, 4, 5, 6000, tzinfo=UTC)) == "0999-01-02T03:04:05.006Z"


@given(st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)))
def test_format_then_parse_keeps_the_millisecond(value: datetime) -> None:
    parsed = parse_timestamp(format_timestamp(value))
    assert parsed == value.replace(microsecond=value.microsecond // 1000 * 1000)


@given(st.text(max_size=40))
def test_arbitrary_text_parses_or_raises_timestamp_error(text: str) -> None:
    try:
        result = parse_timestamp(text)
    except TimestampError:
        return
    assert result.tzinfo is not None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("2024-13-01T00:00:00.000Z", "not a valid date-time"),
        ("2023-02-29T23:59:59.999Z", "not a valid date-time"),
        ("2024-03-05T24:00:00.000Z", "not a valid date-time"),
        ("٢٠٢٤-03-05T10:20:30.123Z", "not a valid date-time"),
    ],
)
def test_the_sdk_shape_that_is_no_date_is_refused_as_the_full_reading_refuses_it(text: str, message: str) -> None:
    # The shape SDKs send is read on a shorter path; what it cannot read goes the full way and is named there.
    with pytest.raises(TimestampError, match=message):
        parse_timestamp(text)


@given(st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59)))
def test_the_sdk_shape_reads_as_the_full_reading_does(value: datetime) -> None:
    text = value.isoformat(timespec="milliseconds") + "Z"
    parsed = parse_timestamp(text)
    assert parsed == value.replace(microsecond=value.microsecond // 1000 * 1000, tzinfo=UTC)
    assert parsed.tzinfo is UTC
