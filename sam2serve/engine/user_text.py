"""What text a user gives may be: one rule for every name and phrase, one for every file
name a dataset is written with. Torch-free, so the service, the command line (before a
model loads) and the Label Studio backend take and refuse exactly the same text.

**Names and phrases** (a tracked object's name, a concept phrase from any surface, a Label
Studio label asked as a concept, an export's category): 1..:data:`MAX_NAME_CHARS`
characters once stripped of surrounding white space, made of what a person can read:
letters of any script with their accents and marks, digits, punctuation, symbols, emoji
and spaces. Refused, naming the code point and where it is:

- control characters (NUL, tab, line feed, ESC, DEL, C1) and the line and paragraph
  separators U+2028, U+2029: they forge lines in logs, files and terminals;
- format characters: the direction controls (U+061C, U+200E, U+200F, the embeddings and
  overrides U+202A..U+202E, the isolates U+2066..U+2069) that reorder the text shown around
  them, and the invisible ones (zero-width space U+200B, word joiner U+2060, BOM U+FEFF,
  soft hyphen, the tag characters U+E0000..U+E007F, ...) that make two names look alike;
- the other invisible code points (combining grapheme joiner U+034F, the Hangul fillers,
  Khmer's inherent vowels) and a variation selector that follows nothing visible;
- surrogates, private-use and unassigned code points, except those Unicode reserves for
  emoji (U+1F000..U+1FAFF, U+1FC00..U+1FFFD): emoji newer than Python's tables pass.

The joiners are format characters with a job. U+200D (ZWJ) is taken between two parts of
an emoji (woman ZWJ laptop is one emoji, technologist; the rainbow flag is white flag,
U+FE0F, ZWJ, rainbow), and ZWJ and U+200C (ZWNJ) after a letter or mark of a script that
is shaped with them (Arabic, Syriac, the Indic scripts, ...: :data:`JOINING_SCRIPTS`) when
another one or the end of a word follows (Persian's ZWNJ, Malayalam's chillu). Anywhere
else a joiner only makes a different name look alike ("c", ZWJ, "at" shows as "cat"), and
it is refused. Emoji tag sequences (the flags of England, Scotland and Wales) are refused
with their tag characters, which can carry hidden text.

**File names** in a dataset (COCO's ``file_name``, a video's folder): one path component
of 1..:data:`MAX_FILE_NAME_BYTES` bytes of UTF-8, taken as given (not stripped), by the
character rule above, with no ``/``, ``\\`` or ``:`` (a drive or a stream on Windows), and
not ``.`` or ``..``: a dataset's names never point outside its folder on any system.
"""

from __future__ import annotations

import unicodedata

MAX_NAME_CHARS = 64  # SAM 3's text encoder reads 32 tokens anyway
MAX_FILE_NAME_BYTES = 255  # a file system's limit for one name
NAME_RULE = (
    "letters of any script, digits, punctuation, symbols, emoji and spaces; no control, "
    "invisible or direction-changing characters"
)
FILE_NAME_RULE = (
    f"one file name: 1..{MAX_FILE_NAME_BYTES} bytes of UTF-8, no '/', '\\' or ':', not '.' "
    "or '..', and no control, invisible or direction-changing characters"
)

_DIRECTION_CONTROLS = frozenset(
    {0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)}
)
_TAGS = range(0xE0000, 0xE0080)
_FILLERS = frozenset({0x034F, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x3164, 0xFFA0})
_SELECTORS = (range(0x180B, 0x1810), range(0xFE00, 0xFE10), range(0xE0100, 0xE01F0))
_EMOJI_RESERVED = (range(0x1F000, 0x1FB00), range(0x1FC00, 0x1FFFE))
ZWNJ, ZWJ = "\u200c", "\u200d"
# Scripts whose text is shaped with ZWJ/ZWNJ (their characters' names start with these).
JOINING_SCRIPTS = frozenset(
    {
        "ARABIC", "SYRIAC", "NKO", "MONGOLIAN", "THAANA", "DEVANAGARI", "BENGALI",
        "GURMUKHI", "GUJARATI", "ORIYA", "TAMIL", "TELUGU", "KANNADA", "MALAYALAM",
        "SINHALA", "MYANMAR", "KHMER", "TIBETAN",
    }
)  # fmt: skip
_UNREADABLE = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})
_PATH_CHARS = {"/": "a path separator", "\\": "a path separator", ":": "a drive or stream mark"}


def check_name(text: str, what: str = "the name", max_chars: int = MAX_NAME_CHARS) -> str:
    """``text`` stripped of surrounding white space; a ValueError naming ``what``, the text
    and the problem when it is empty, longer than ``max_chars`` characters or holds a
    refused character."""
    name = text.strip()
    if not name:
        raise ValueError(f"{what} is empty")
    if len(name) > max_chars:
        raise ValueError(
            f"{what} {shown(name)} has {len(name)} characters; the limit is {max_chars}"
        )
    refused = refused_character(name)
    if refused is not None:
        raise ValueError(f"{what} {shown(name)} has {refused}; names and phrases take {NAME_RULE}")
    return name


def check_file_name(text: str, what: str = "the file name") -> str:
    """``text`` itself when it is one safe file name (:data:`FILE_NAME_RULE`); else a
    ValueError naming ``what``, the text and the problem."""
    size = len(text.encode("utf-8", "surrogatepass"))
    problem = None
    if not text:
        problem = "is empty"
    elif size > MAX_FILE_NAME_BYTES:
        problem = f"is {size} bytes of UTF-8; the limit is {MAX_FILE_NAME_BYTES}"
    elif text in (".", ".."):
        problem = "names a folder, not a file"
    else:
        for index, char in enumerate(text):
            if char in _PATH_CHARS:
                problem = f"has {char!r} ({_PATH_CHARS[char]}) at {index}"
                break
        else:
            refused = refused_character(text)
            problem = None if refused is None else f"has {refused}"
    if problem is not None:
        raise ValueError(f"{what} {shown(text)} {problem}; a dataset takes {FILE_NAME_RULE}")
    return text


def refused_character(text: str) -> str | None:
    """The first character of ``text`` the rule refuses, described (``U+202E
    RIGHT-TO-LEFT OVERRIDE (a direction control) at 1``); None when every one is taken."""
    for index, char in enumerate(text):
        kind = _refusal(text, index)
        if kind is not None:
            name = unicodedata.name(char, "")
            return f"U+{ord(char):04X}{' ' + name if name else ''} ({kind}) at {index}"
    return None


def shown(text: str, limit: int = 40) -> str:
    """``text`` quoted for a message: escaped where it is not printable, cut when long."""
    return repr(text) if len(text) <= limit else repr(text[: limit - 3]) + "..."


def _refusal(text: str, index: int) -> str | None:
    """Why the character at ``index`` is refused (None: it is taken)."""
    char = text[index]
    code = ord(char)
    category = unicodedata.category(char)
    if category == "Cc":
        return "a control character"
    if category in ("Zl", "Zp"):
        return "a line or paragraph separator"
    if category == "Cs":
        return "a surrogate"
    if category == "Co":
        return "a private-use character"
    if category == "Cn":
        return None if _emoji_reserved(code) else "an unassigned code point"
    if char in (ZWJ, ZWNJ):
        return None if _joins(text, index) else "a joiner outside an emoji or a joining script"
    if code in _DIRECTION_CONTROLS:
        return "a direction control"
    if code in _TAGS:
        return "a tag character"
    if category == "Cf":
        return "an invisible format character"
    if code in _FILLERS:
        return "an invisible character"
    if _selector(code) and not _has_base(text, index):
        return "a variation selector with nothing before it"
    return None


def _emoji_reserved(code: int) -> bool:
    return any(code in block for block in _EMOJI_RESERVED)


def _selector(code: int) -> bool:
    return any(code in block for block in _SELECTORS)


def _has_base(text: str, index: int) -> bool:
    if index == 0:
        return False
    before = text[index - 1]
    return not (
        before.isspace()
        or _selector(ord(before))
        or unicodedata.category(before) in _UNREADABLE
        and not _emoji_reserved(ord(before))
    )


def _joins(text: str, index: int) -> bool:
    """A joiner between two emoji parts (ZWJ only), or after a character of a joining
    script and before another one or the end of a word."""
    if index == 0:
        return False
    before = text[index - 1]
    after = text[index + 1] if index + 1 < len(text) else " "
    if _joining_script(before) and (after.isspace() or _joining_script(after)):
        return True  # a word may end in one: Malayalam's chillu (NA, VIRAMA, ZWJ)
    return text[index] == ZWJ and _emoji_part(before) and _emoji_part(after)


def _joining_script(char: str) -> bool:
    return unicodedata.name(char, "").partition(" ")[0] in JOINING_SCRIPTS


def _emoji_part(char: str) -> bool:
    """A pictograph (So), a skin-tone modifier (Sk), the emoji presentation selector, or a
    code point reserved for emoji."""
    code = ord(char)
    if code < 0x80:
        return False
    return unicodedata.category(char) in ("So", "Sk") or code == 0xFE0F or _emoji_reserved(code)


__all__ = [
    "FILE_NAME_RULE",
    "JOINING_SCRIPTS",
    "MAX_FILE_NAME_BYTES",
    "MAX_NAME_CHARS",
    "NAME_RULE",
    "check_file_name",
    "check_name",
    "refused_character",
    "shown",
]
