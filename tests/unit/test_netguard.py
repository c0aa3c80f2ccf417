"""The SSRF guard's pure parts: the address policy, the resolver filter, the URL pre-check."""

from __future__ import annotations

import ipaddress
import socket

import pytest
from yarl import URL

from receiver.errors import PermanentError
from receiver.netguard import (
    AddressRefused,
    GuardedResolver,
    check_url,
    guarded_socket_factory,
    is_public_address,
)
from tests.support.downloads import MapResolver

REFUSED = [
    "127.0.0.1",
    "127.255.255.254",
    "0.0.0.0",
    "10.0.0.1",
    "172.16.0.1",
    "172.31.255.255",
    "192.168.1.1",
    "169.254.169.254",
    "169.254.0.1",
    "100.64.0.1",
    "100.127.255.255",
    "224.0.0.1",
    "239.255.255.250",
    "255.255.255.255",
    "240.0.0.1",
    "192.0.2.1",
    "198.18.0.1",
    "::1",
    "::",
    "fe80::1",
    "fe80::1%1",
    "fc00::1",
    "fd12:3456:789a::1",
    "fec0::1",
    "ff02::1",
    "ff0e::1",
    "::ffff:127.0.0.1",
    "::ffff:10.0.0.1",
    "::ffff:169.254.169.254",
    "::127.0.0.1",
    "::8.8.8.8",
    "2002:7f00:1::1",  # 6to4 of 127.0.0.1
    "2002:a00:1::1",  # 6to4 of 10.0.0.1
    "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
    "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
    "64:ff9b:1::1",
    "2001::1",  # Teredo
    "2001:db8::1",  # documentation
    "not an address",
    "",
]

PUBLIC = [
    "8.8.8.8",
    "1.1.1.1",
    "93.184.216.34",
    "100.63.255.255",
    "100.128.0.0",
    "172.32.0.1",
    "2606:4700:4700::1111",
    "2a00:1450:4001:80b::200e",
    "::ffff:8.8.8.8",
    "2002:808:808::1",  # 6to4 of 8.8.8.8
    "64:ff9b::808:808",  # NAT64 of 8.8.8.8
]


@pytest.mark.parametrize("address", REFUSED)
def test_refused_addresses(address: str) -> None:
    assert not is_public_address(address)


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses(address: str) -> None:
    assert is_public_address(address)
    assert is_public_address(ipaddress.ip_address(address))


async def test_resolver_drops_private_answers() -> None:
    inner = MapResolver({"mixed.test": ["10.0.0.5", "8.8.8.8", "::1", "2606:4700::1"]})
    resolver = GuardedResolver(inner)
    answers = await resolver.resolve("mixed.test", 443)
    assert [a["host"] for a in answers] == ["8.8.8.8", "2606:4700::1"]
    assert all(a["port"] == 443 for a in answers)


@pytest.mark.parametrize(
    "answers", [["127.0.0.1"], ["10.0.0.1", "169.254.169.254"], ["::ffff:127.0.0.1"], []]
)
async def test_resolver_refuses_when_nothing_public_is_left(answers: list[str]) -> None:
    resolver = GuardedResolver(MapResolver({"evil.test": answers}))
    with pytest.raises(AddressRefused) as caught:
        await resolver.resolve("evil.test", 80)
    assert isinstance(caught.value, OSError)
    assert "refused: evil.test resolves to a private address" in str(caught.value)


async def test_resolver_uses_the_injected_policy_and_closes_inner() -> None:
    inner = MapResolver({"lo.test": ["127.0.0.1", "127.0.0.2"]})
    resolver = GuardedResolver(inner, is_allowed=lambda ip: str(ip) == "127.0.0.1")
    assert [a["host"] for a in await resolver.resolve("lo.test")] == ["127.0.0.1"]
    await resolver.close()
    assert inner.closed


async def test_resolver_with_the_real_default_resolver_refuses_localhost() -> None:
    resolver = GuardedResolver()
    try:
        with pytest.raises(AddressRefused):
            await resolver.resolve("localhost", 80, socket.AF_UNSPEC)
    finally:
        await resolver.close()


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/x",
        "http://10.0.0.1/x",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]:8080/x",
        "http://[::ffff:127.0.0.1]/x",
        "http://[fe80::1]/x",
        "https://0.0.0.0/",
        "http://127.1/",
        "http://2130706433/",
        "http://127.0.0.1./",
    ],
)
def test_check_url_refuses_private_literals(url: str) -> None:
    with pytest.raises(PermanentError, match="refused"):
        check_url(URL(url), allow_private=False, is_allowed=is_public_address)


@pytest.mark.parametrize(
    "url", ["file:///etc/passwd", "ftp://example.com/x", "gopher://x/", "data:,x", "/relative"]
)
def test_check_url_refuses_other_schemes_even_when_private_is_allowed(url: str) -> None:
    for allow_private in (False, True):
        with pytest.raises(PermanentError, match="only http"):
            check_url(URL(url), allow_private=allow_private, is_allowed=is_public_address)


@pytest.mark.parametrize(
    "url", ["https://cdn.example.com/a.png?sig=1", "http://8.8.8.8/x", "http://[2606:4700::1]/"]
)
def test_check_url_leaves_names_and_public_literals_alone(url: str) -> None:
    check_url(URL(url), allow_private=False, is_allowed=is_public_address)


def test_check_url_allows_private_literals_when_told() -> None:
    check_url(URL("http://127.0.0.1:9/x"), allow_private=True, is_allowed=is_public_address)


@pytest.mark.parametrize(
    ("family", "sockaddr"),
    [
        (socket.AF_INET, ("127.0.0.1", 80)),
        (socket.AF_INET, ("169.254.169.254", 80)),
        (socket.AF_INET6, ("::1", 80, 0, 0)),
        (socket.AF_INET6, ("::ffff:10.0.0.1", 80, 0, 0)),
    ],
)
def test_socket_factory_refuses_the_exact_address_connected_to(
    family: socket.AddressFamily, sockaddr: tuple[object, ...]
) -> None:
    factory = guarded_socket_factory(is_public_address)
    with pytest.raises(AddressRefused, match="refused"):
        factory((family, socket.SOCK_STREAM, 6, "", sockaddr))


def test_socket_factory_creates_a_socket_for_an_allowed_address() -> None:
    factory = guarded_socket_factory(is_public_address)
    sock = factory((socket.AF_INET, socket.SOCK_STREAM, 6, "", ("8.8.8.8", 443)))
    try:
        assert sock.family == socket.AF_INET
        assert sock.type == socket.SOCK_STREAM
    finally:
        sock.close()
