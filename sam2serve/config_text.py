"""Configuration text to values: one strict parser per kind, used by every flag and every
``SAM2SERVE_*`` variable (torch-free).

Python's ``int()`` and ``float()`` read more than a person means by a number: any
Unicode digits (``'１２'``), ``'1_000'``, ``' 12 '``, ``'nan'``, ``'inf'``, and a finite
float can still overflow once scaled (``int(1e308 * MiB)`` raises OverflowError). Here a
number is ASCII: an optional sign, digits, and for a real number an optional fraction and
exponent; it must be finite, within its setting's bounds, and within what no setting
exceeds (:data:`MAX_INTEGER`, :data:`MAX_NUMBER`, and :data:`MAX_BYTES` for a count of
units such as MiB). A URL is ``http(s)://HOST[:PORT][/PATH]``, its port in 1..65535 and no
user name or password in it.

Each parser raises :class:`ConfigValueError` (a ValueError) saying what is accepted and
showing the text it got (truncated); the argparse types (:class:`Integer`, :class:`Number`,
:class:`Units`, :func:`http_url`) raise ``argparse.ArgumentTypeError`` with the same text, so
the command line's one error line names the flag or the variable that gave the value.
"""

from __future__ import annotations

import argparse
import ipaddress
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlsplit

__all__ = [
    "MAX_BYTES",
    "MAX_INTEGER",
    "MAX_NUMBER",
    "ConfigValueError",
    "Integer",
    "Number",
    "Units",
    "http_url",
    "parse_http_url",
    "parse_integer",
    "parse_number",
    "parse_path",
    "parse_switch",
    "shown",
]

# No setting is an integer beyond int64 (what torch and numpy take), nor a real number
# beyond 1e9 (seconds: ~31 years, below threading's and asyncio's largest timeouts), nor a
# byte budget beyond 1 TiB.
MAX_INTEGER = 2**63 - 1
MAX_NUMBER = 1e9
MAX_BYTES = 2**40
_LONGEST = 40  # characters of a number's text; more is refused before it is read
_INTEGER = re.compile(r"[+-]?[0-9]+")
_REAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_SHOWN = 40  # characters of a bad value an error message shows
T = TypeVar("T")


class ConfigValueError(ValueError):
    """A configuration text that is not a value of its kind; the message says what is
    accepted and shows the text."""


def shown(text: str) -> str:
    """``text`` as an error message shows it: its repr, cut after 40 characters."""
    if len(text) <= _SHOWN:
        return repr(text)
    return f"{text[:_SHOWN]!r}... ({len(text)} characters)"


def _bounds(kind: str, low: float | None, high: float | None, low_open: bool = False) -> str:
    """``an integer in [1, 65535]``, ``a number > 0``, ..."""
    if low is None and high is None:
        return kind
    if high is None:
        return f"{kind} {'>' if low_open else '>='} {low:g}"
    if low is None:
        return f"{kind} <= {high:g}"
    return f"{kind} in {'(' if low_open else '['}{low:g}, {high:g}]"


def parse_integer(text: str, low: int | None = None, high: int | None = None) -> int:
    """An integer written in ASCII digits (optional sign), in ``[low, high]``."""
    accepted = _bounds("an integer", low, high)
    if len(text) > _LONGEST or not _INTEGER.fullmatch(text):
        raise ConfigValueError(f"expected {accepted}, got {shown(text)}")
    value = int(text)
    if abs(value) > MAX_INTEGER:
        raise ConfigValueError(f"expected {accepted} (at most {MAX_INTEGER}), got {shown(text)}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise ConfigValueError(f"expected {accepted}, got {shown(text)}")
    return value


def parse_number(
    text: str, low: float | None = None, high: float | None = None, low_open: bool = False
) -> float:
    """A finite real number written in ASCII (``12``, ``-0.5``, ``.5``, ``1e3``), in its
    bounds and at most :data:`MAX_NUMBER` in size."""
    accepted = _bounds("a number", low, high, low_open)
    if len(text) > _LONGEST or not _REAL.fullmatch(text):
        raise ConfigValueError(f"expected {accepted}, got {shown(text)}")
    value = float(text)
    if not math.isfinite(value) or abs(value) > MAX_NUMBER:
        raise ConfigValueError(
            f"expected {accepted} (at most {MAX_NUMBER:,.0f} in size), got {shown(text)}"
        )
    if low is not None and (value <= low if low_open else value < low):
        raise ConfigValueError(f"expected {accepted}, got {shown(text)}")
    if high is not None and value > high:
        raise ConfigValueError(f"expected {accepted}, got {shown(text)}")
    return value


def _for_argparse(parse: Callable[[str], T], text: str) -> T:
    """``parse(text)``, its ConfigValueError as the ArgumentTypeError argparse reports."""
    try:
        return parse(text)
    except ConfigValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


@dataclass(frozen=True)
class Integer:
    """argparse ``type`` of an integer flag: :func:`parse_integer` with these bounds."""

    low: int | None = None
    high: int | None = None

    def __call__(self, text: str) -> int:
        return _for_argparse(lambda t: parse_integer(t, self.low, self.high), text)


@dataclass(frozen=True)
class Number:
    """argparse ``type`` of a real-number flag: :func:`parse_number` with these bounds."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False

    def __call__(self, text: str) -> float:
        return _for_argparse(lambda t: parse_number(t, self.low, self.high, self.low_open), text)


@dataclass(frozen=True)
class Units:
    """argparse ``type`` of a flag given in units of the field's integer (``--...-mib``: a
    number of MiB, the field in bytes): the number, then the field's value, which must be
    at least ``low`` (in the field's unit) and at most ``high`` (default :data:`MAX_BYTES`)."""

    scale: int
    unit: str = "MiB"
    low: int | None = None
    high: int = MAX_BYTES

    def accepted(self) -> str:
        largest = self.high / self.scale
        most = f"at most {int(largest) if largest.is_integer() else f'{largest:g}'}"
        if self.low is None:
            return f"a number of {self.unit}, {most}"
        sign = ">" if self.low > 0 else ">="
        return f"a number of {self.unit} {sign} 0, {most}"

    def parse(self, text: str) -> int:
        if len(text) > _LONGEST or not _REAL.fullmatch(text):
            raise ConfigValueError(f"expected {self.accepted()}, got {shown(text)}")
        number = float(text)
        if not math.isfinite(number) or abs(number) * self.scale > self.high:
            raise ConfigValueError(f"expected {self.accepted()}, got {shown(text)}")
        value = int(number * self.scale)
        if self.low is not None and value < self.low:
            raise ConfigValueError(f"expected {self.accepted()}, got {shown(text)}")
        return value

    def __call__(self, text: str) -> int:
        return _for_argparse(self.parse, text)


def parse_http_url(text: str) -> str:
    """An ``http://`` or ``https://`` URL with a host, a port in 1..65535 if it names one,
    and no user name or password; returned as given."""
    accepted = "an http:// or https:// URL with a host (http(s)://HOST[:PORT][/PATH])"
    if not text.isascii() or not text.isprintable() or any(c.isspace() for c in text):
        raise ConfigValueError(f"expected {accepted}, got {shown(text)}")
    try:
        parts = urlsplit(text)
        port = parts.port  # ValueError for a port out of range or not a number
        host = parts.hostname
    except ValueError as exc:
        raise ConfigValueError(f"expected {accepted}, got {shown(text)} ({exc})") from None
    if parts.scheme not in ("http", "https") or not host:
        raise ConfigValueError(f"expected {accepted}, got {shown(text)}")
    if port == 0:
        raise ConfigValueError(f"expected {accepted}, got {shown(text)} (port 0)")
    if parts.username is not None or parts.password is not None:
        raise ConfigValueError(
            f"expected {accepted} without a user name or password, got a URL with them"
        )
    if parts.netloc.startswith("[") or ":" in host:  # an IPv6 literal must be one
        try:
            ipaddress.IPv6Address(host.split("%", 1)[0])
        except ValueError:
            raise ConfigValueError(f"expected {accepted}, got {shown(text)}") from None
    return text


def parse_path(text: str) -> str:
    """A file or folder path: not blank, no control characters (a newline, NUL)."""
    if not text.strip() or not text.isprintable():
        raise ConfigValueError(f"expected a path, got {shown(text)}")
    return text


def parse_switch(text: str) -> bool:
    """``1`` (on) or ``0`` (off)."""
    if text not in ("0", "1"):
        raise ConfigValueError(f"expected 1 (on) or 0 (off), got {shown(text)}")
    return text == "1"


def parse_sha256(text: str) -> str:
    """A sha256 digest: 64 hex digits (either case, surrounding blanks ignored), lowercased."""
    digest = text.strip().lower()
    if len(digest) != 64 or not all(c in "0123456789abcdef" for c in digest):
        raise ConfigValueError(f"expected a sha256 (64 hex digits), got {shown(text)}")
    return digest


def sha256_digest(text: str) -> str:
    """argparse ``type`` of a sha256 flag: :func:`parse_sha256`."""
    return _for_argparse(parse_sha256, text)


def http_url(text: str) -> str:
    """argparse ``type`` of a URL flag: :func:`parse_http_url`."""
    return _for_argparse(parse_http_url, text)
