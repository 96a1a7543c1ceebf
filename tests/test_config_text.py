"""The strict configuration parsers (sam2serve.config_text), value by value."""

from __future__ import annotations

import argparse

import pytest

from sam2serve.config_text import (
    MAX_BYTES,
    MAX_INTEGER,
    ConfigValueError,
    Integer,
    Number,
    Units,
    http_url,
    parse_http_url,
    parse_integer,
    parse_number,
    parse_path,
    parse_switch,
    shown,
)

MiB = 1024 * 1024


@pytest.mark.parametrize(
    ("text", "value"),
    [("12", 12), ("+12", 12), ("-3", -3), ("007", 7), (str(MAX_INTEGER), MAX_INTEGER)],
)
def test_integers_a_person_writes_are_read(text, value):
    assert parse_integer(text) == value


@pytest.mark.parametrize(
    "text",
    [
        "１２",
        "١٢",
        " 12",
        "12 ",
        "1_000",
        "12abc",
        "",
        " ",
        "1.0",
        "1e3",
        "0x10",
        "nan",
        str(MAX_INTEGER + 1),
        "9" * 400,
        "--1",
        "+",
    ],
)
def test_anything_else_is_not_an_integer(text):
    with pytest.raises(ConfigValueError, match="expected an integer"):
        parse_integer(text)


def test_integer_bounds_are_in_the_message():
    with pytest.raises(ConfigValueError, match=r"expected an integer in \[1, 65535\], got '0'"):
        parse_integer("0", 1, 65535)
    assert parse_integer("65535", 1, 65535) == 65535


@pytest.mark.parametrize(
    ("text", "value"),
    [("12", 12.0), ("-0.5", -0.5), (".5", 0.5), ("5.", 5.0), ("1e3", 1000.0), ("1E-3", 0.001)],
)
def test_numbers_a_person_writes_are_read(text, value):
    assert parse_number(text) == value


@pytest.mark.parametrize(
    "text",
    [
        "nan",
        "inf",
        "-inf",
        "Infinity",
        "1e309",
        "1e300",
        "2e9",
        "１.５",
        "1_0.5",
        " 1",
        "",
        ".",
        "e3",
        "1e",
        "9" * 400,
    ],
)
def test_anything_else_is_not_a_number(text):
    with pytest.raises(ConfigValueError, match="expected a number"):
        parse_number(text)


def test_number_bounds_open_and_closed():
    with pytest.raises(ConfigValueError, match=r"a number > 0, got '0'"):
        parse_number("0", low=0, low_open=True)
    assert parse_number("0", low=0) == 0.0
    with pytest.raises(ConfigValueError, match=r"a number in \[0, 1\], got '1.5'"):
        parse_number("1.5", 0, 1)


def test_units_convert_without_overflow():
    units = Units(MiB, low=1)
    assert units("16") == 16 * MiB and units("0.5") == MiB // 2
    assert units(str(MAX_BYTES // MiB)) == MAX_BYTES
    for text in ("1e308", "1e300", str(MAX_BYTES // MiB + 1), "-1", "0", "nan", "１２"):
        with pytest.raises(
            argparse.ArgumentTypeError, match="a number of MiB > 0, at most 1048576"
        ):
            units(text)
    assert Units(MiB, low=0)("0") == 0


def test_argparse_types_name_the_flag():
    parser = argparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--n", type=Integer(1, 9))
    parser.add_argument("--x", type=Number(0, 1))
    parser.add_argument("--url", type=http_url)
    assert parser.parse_args(["--n", "3", "--x", ".5"]).n == 3
    for argv, flag in (
        (["--n", "１"], "--n"),
        (["--x", "nan"], "--x"),
        (["--url", "ftp://h"], "--url"),
    ):
        with pytest.raises(argparse.ArgumentError, match=f"argument {flag}: expected"):
            parser.parse_args(argv)


@pytest.mark.parametrize(
    "url",
    [
        "http://h",
        "https://mirror.example/sam2/",
        "http://127.0.0.1:8080/x",
        "http://[::1]:9/p",
        "https://h:65535",
    ],
)
def test_http_urls_are_kept_as_given(url):
    assert parse_http_url(url) == url


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://h:99999", "Port out of range"),
        ("http://h:abc", "Port could not be cast"),
        ("http://h:0", "port 0"),
        ("http://[::1", "Invalid IPv6 URL"),
        ("http://[not-v6]/", "expected an http"),
        ("ftp://x", "expected an http"),
        ("http://", "expected an http"),
        ("h:8080", "expected an http"),
        ("http:// h/", "expected an http"),
        ("http://h/\n", "expected an http"),
        ("http://exämple.org", "expected an http"),
    ],
)
def test_bad_urls_say_why(url, why):
    with pytest.raises(ConfigValueError, match="expected an http") as error:
        parse_http_url(url)
    assert why in str(error.value)


def test_a_url_with_a_password_is_refused_without_showing_it():
    with pytest.raises(ConfigValueError) as error:
        parse_http_url("https://user:s3cret@mirror.example/")
    assert "s3cret" not in str(error.value) and "password" in str(error.value)


def test_paths_switches_and_how_values_are_shown():
    assert parse_path("/var/cache/sam2serve") == "/var/cache/sam2serve"
    for text in (" ", "a\nb", "\t"):
        with pytest.raises(ConfigValueError, match="expected a path"):
            parse_path(text)
    assert parse_switch("1") is True and parse_switch("0") is False
    with pytest.raises(ConfigValueError, match=r"expected 1 \(on\) or 0 \(off\), got 'true'"):
        parse_switch("true")
    assert shown("abc") == "'abc'"
    long = shown("9" * 400)
    assert long.endswith("... (400 characters)") and len(long) < 70
