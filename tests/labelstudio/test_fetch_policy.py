"""The fetch policy on its own: which addresses and ports a URL may lead to, from the
operator's allow-list and the address ranges (no network: addresses are given)."""

from __future__ import annotations

import ipaddress

import pytest

from sam2serve.labelstudio.fetch_policy import AllowedHost, FetchPolicy, FetchRefused, is_public
from sam2serve.labelstudio.options import LabelStudioOptions


def addresses(*texts: str) -> list:
    return [ipaddress.ip_address(text) for text in texts]


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("93.184.216.34", True),
        ("2606:4700:4700::1111", True),
        ("127.0.0.1", False),
        ("127.255.0.9", False),
        ("10.1.2.3", False),
        ("172.16.0.1", False),
        ("192.168.1.1", False),
        ("169.254.169.254", False),  # cloud metadata
        ("100.64.0.1", False),  # shared (carrier-grade NAT)
        ("0.0.0.0", False),
        ("224.0.0.1", False),
        ("255.255.255.255", False),
        ("::1", False),
        ("::", False),
        ("fe80::1", False),
        ("fc00::1", False),
        ("::ffff:127.0.0.1", False),  # IPv4-mapped loopback
        ("::ffff:93.184.216.34", True),
        ("2002:7f00:1::1", False),  # 6to4 of 127.0.0.1
    ],
)
def test_public_means_global_unicast(address, public):
    assert is_public(ipaddress.ip_address(address)) is public


def test_public_hosts_only_on_web_ports_and_all_addresses_checked():
    policy = FetchPolicy()
    assert policy.allows_addresses(addresses("93.184.216.34"), 443)
    assert policy.allows_addresses(addresses("93.184.216.34"), 80)
    assert not policy.allows_addresses(addresses("93.184.216.34"), 8080)
    # One internal address among public ones is enough to refuse (DNS may answer both).
    assert not policy.allows_addresses(addresses("93.184.216.34", "127.0.0.1"), 80)
    assert not policy.allows_addresses([], 80)  # does not resolve
    assert not FetchPolicy(public=False).allows_addresses(addresses("93.184.216.34"), 443)


def test_the_allow_list_names_hosts_addresses_and_networks():
    policy = FetchPolicy.of(("images.lan:8081", "10.0.0.0/8", "127.0.0.1:9000", "[::1]:9001"))
    assert policy.trusts_name("IMAGES.lan.", 8081) and not policy.trusts_name("images.lan", 80)
    assert policy.allows_addresses(addresses("10.9.8.7"), 1234)  # a network, any port
    assert policy.allows_addresses(addresses("127.0.0.1"), 9000)
    assert not policy.allows_addresses(addresses("127.0.0.1"), 9001)
    assert policy.allows_addresses(addresses("::ffff:127.0.0.1"), 9000)  # the same address
    assert policy.allows_addresses(addresses("::1"), 9001)
    assert policy.names_allowed("http://images.lan:8081/")
    assert policy.names_allowed("http://127.0.0.1:9000")
    assert not policy.names_allowed("http://127.0.0.1:9002")
    assert not policy.names_allowed("http://other.lan:8081")


def test_the_label_studio_url_is_on_the_allow_list():
    policy = LabelStudioOptions(url="http://localhost:8080").fetch_policy()
    assert policy.trusts_name("localhost", 8080) and not policy.trusts_name("localhost", 8081)
    policy = LabelStudioOptions(url="http://[::1]:8080").fetch_policy()
    assert policy.allows_addresses(addresses("::1"), 8080)


@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.com/a.png",
        "file:///etc/passwd",
        "http://user:pw@example.com/a.png",
        "http:///a.png",
        "http://example.com:0/a.png",
        "http://example.com:99999/a.png",
        "http://[::1/a.png",
    ],
)
def test_urls_outside_the_policy_are_refused_before_resolution(url):
    with pytest.raises(FetchRefused):
        FetchPolicy().target(url)


def test_targets_carry_the_schemes_port():
    assert FetchPolicy().target("HTTPS://Example.com/a") == ("https", "example.com", 443)
    assert FetchPolicy().target("http://example.com:8080/a") == ("http", "example.com", 8080)


@pytest.mark.parametrize("entry", ["", "http://x/", "x:0", "x:65536", "a/b", "user@host"])
def test_bad_allow_list_entries_say_what_is_accepted(entry):
    with pytest.raises(ValueError, match="expected HOST"):
        AllowedHost.parse(entry)
