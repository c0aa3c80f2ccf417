import hashlib
import hmac

import pytest
from hypothesis import given
from hypothesis import strategies as st

from receiver.errors import SignatureError
from receiver.signature import (
    HmacKey,
    compute,
    parse_header,
    sign,
    verify,
    webhook_headers,
)
from receiver.signature import check as check_signature

SECRET = "whsec_test"
BODY = b'{"id":"evt_1","object":"event","event":"job.completed","job_id":"job_1"}'
NOW = 1_800_000_000


def check(header, *, body=BODY, secrets=(SECRET,), now=NOW, tolerance=300, **kw):
    return verify(
        secrets=secrets, body=body, header=header, now=now, tolerance_seconds=tolerance, **kw
    )


def test_matches_an_independent_hmac():
    expected = hmac.new(SECRET.encode(), f"{NOW}.".encode() + BODY, hashlib.sha256).hexdigest()
    assert sign(SECRET, BODY, NOW) == f"t={NOW},v1={expected}"
    assert compute(SECRET, NOW, BODY) == expected


def test_valid_signature_verifies_with_skew():
    result = check(sign(SECRET, BODY, NOW - 12))
    assert result.secret_index == 0
    assert result.skew_seconds == 12
    assert result.scheme == "v1"


def test_any_of_several_secrets_matches_and_reports_its_position():
    header = sign("new-secret", BODY, NOW)
    result = check(header, secrets=("old-secret", "new-secret"))
    assert result.secret_index == 1


def test_several_v1_values_and_unknown_schemes():
    good = compute(SECRET, NOW, BODY)
    header = f"t={NOW},v0=abc,v1={'0' * 64},v1={good},v9=whatever"
    assert check(header).secret_index == 0


def test_missing_header():
    with pytest.raises(SignatureError) as err:
        check(None)
    assert err.value.outcome == "missing_signature"


@pytest.mark.parametrize(
    "header",
    [
        "",
        "garbage",
        "t=,v1=" + "a" * 64,
        f"v1={'a' * 64}",  # no timestamp
        f"t={NOW}",  # no v1
        f"t=abc,v1={'a' * 64}",
        f"t={NOW},t={NOW},v1={'a' * 64}",
        f"t={NOW},v1=xyz",
        f"t={NOW},v1={'g' * 64}",
        f"t=-5,v1={'a' * 64}",
        f"t={NOW},,v1={'a' * 64}",
        "t=" + "9" * 40 + ",v1=" + "a" * 64,
        "x" * 10_000,
        f"t=١٢٣,v1={'a' * 64}",  # non-ASCII digits
    ],
)
def test_malformed_headers_are_invalid_not_crashes(header):
    with pytest.raises(SignatureError) as err:
        check(header)
    assert err.value.outcome == "invalid_signature"


def test_wrong_secret_is_invalid():
    with pytest.raises(SignatureError) as err:
        check(sign("other", BODY, NOW))
    assert err.value.outcome == "invalid_signature"


def test_one_changed_byte_is_invalid():
    header = sign(SECRET, BODY, NOW)
    with pytest.raises(SignatureError):
        check(header, body=BODY.replace(b"job_1", b"job_2"))


@pytest.mark.parametrize("offset", [301, -301, 10_000, -10_000])
def test_stale_in_both_directions(offset):
    with pytest.raises(SignatureError) as err:
        check(sign(SECRET, BODY, NOW + offset))
    assert err.value.outcome == "stale_timestamp"
    assert err.value.skew_seconds == -offset
    assert "s from the receiver's clock" in err.value.message


@pytest.mark.parametrize("offset", [300, -300, 0])
def test_inside_tolerance_edges(offset):
    assert check(sign(SECRET, BODY, NOW + offset)).skew_seconds == -offset


def test_uppercase_hex_accepted():
    good = compute(SECRET, NOW, BODY).upper()
    assert check(f"t={NOW},v1={good}").secret_index == 0


def test_legacy_signature_only_when_allowed():
    legacy = "sha256=" + hmac.new(SECRET.encode(), BODY, hashlib.sha256).hexdigest()
    with pytest.raises(SignatureError) as err:
        check(None, legacy_header=legacy)
    assert err.value.outcome == "missing_signature"
    result = check(None, legacy_header=legacy, allow_legacy=True)
    assert result.scheme == "legacy"
    with pytest.raises(SignatureError) as err:
        check(None, legacy_header="sha256=" + "0" * 64, allow_legacy=True)
    assert err.value.outcome == "invalid_signature"
    with pytest.raises(SignatureError):
        check(None, legacy_header="md5=abc", allow_legacy=True)


def test_webhook_headers_are_the_upstreams_five():
    headers = webhook_headers(SECRET, BODY, NOW, event_id="evt_1", event_name="job.completed")
    assert headers["Service-Event-Id"] == "evt_1"
    assert headers["X-Service-Event"] == "job.completed"
    assert headers["X-Service-Timestamp"] == str(NOW)
    assert parse_header(headers["Service-Signature"])[0] == NOW
    legacy = hmac.new(SECRET.encode(), BODY, hashlib.sha256).hexdigest()
    assert headers["X-Service-Signature"] == f"sha256={legacy}"


@given(
    body=st.binary(max_size=2048),
    secret=st.text(min_size=1, max_size=40),
    t=st.integers(min_value=0, max_value=10**11),
)
def test_sign_then_verify_round_trips(body, secret, t):
    result = verify(
        secrets=[secret], body=body, header=sign(secret, body, t), now=t, tolerance_seconds=300
    )
    assert result.secret_index == 0


@given(header=st.text(max_size=300))
def test_arbitrary_headers_never_raise_anything_else(header):
    try:
        check(header)
    except SignatureError as exc:
        assert exc.outcome in ("invalid_signature", "stale_timestamp")


@given(key=st.binary(max_size=200), message=st.binary(max_size=2048))
def test_prepared_key_is_hmac_sha256(key, message):
    """HmacKey (the padded key hashed once) gives the standard library's HMAC, for keys
    shorter than, as long as and longer than SHA-256's 64-byte block."""
    assert HmacKey(key).digest(message) == hmac.digest(key, message, "sha256")
    assert HmacKey(key.decode("latin-1")).digest(message) == hmac.digest(
        key.decode("latin-1").encode(), message, "sha256"
    )


def test_check_takes_prepared_keys_and_gives_position_and_timestamp():
    keys = (HmacKey("old-secret"), HmacKey(SECRET))
    header = sign(SECRET, BODY, NOW - 7)
    assert check_signature(keys, BODY, header, NOW, 300) == (1, NOW - 7)
    legacy = "sha256=" + hmac.new(SECRET.encode(), BODY, hashlib.sha256).hexdigest()
    assert check_signature(keys, BODY, None, NOW, 300, legacy, True) == (1, None)
