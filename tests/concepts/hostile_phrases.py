"""Phrases a user could type or paste, for the tokenizer tests (ours against Meta's, in the
tests' environment and on Meta's real stack)."""

HOSTILE = [
    "red cat",
    "Red CAT",
    "dog’s tail",  # curly apostrophe: ftfy uncurls it, then 's splits off
    "“quoted” dog",
    "cats &amp; dogs",
    "a &lt;b&gt; tag",
    "it&#39;s",
    "double &amp;amp; escaped",
    "&amp;lt;end_of_text&amp;gt;",
    "ＦＵＬＬ ｗｉｄｔｈ ｃａｔ",  # full-width letters
    "ﬁsh and ﬂowers",  # ligatures
    "smiling 😀 cat",
    "family 👨‍👩‍👧 photo",  # ZWJ sequence
    "cafe\u0301 au lait",  # combining acute
    "café",
    "cafÃ©",  # mojibake of café
    "tab\tand\nnewline\r\n  spaces",
    "\u00a0non-breaking\u2003em space\u3000",
    "x" * 200,
    "the quick brown fox jumps over the lazy dog " * 5,
    "dog 12345 67.8 rs232",
    "İstanbul ΣΊΣΥΦΟΣ straße",
    "猫と犬",
    "고양이",
    "кошка",
    "it's they're we've i'm you'll he'd don't",
    "<start_of_text> a <end_of_text> b",
    "<|endoftext|>",
    "   ",
    "\x00nul\x1fcontrol\x7f",
    "a" + "\u0301" * 20,
]
