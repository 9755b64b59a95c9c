"""User strings made safe for the terminal: module and class names, file names, workload names and run tags
come from users (a model file, a trace, a run store) and are printed as text, never as rich markup or as
terminal commands.

``clean`` removes what a terminal would act on: escape sequences whole (CSI such as ``ESC [2J``, clear
screen; OSC such as ``ESC ]8;;URL ESC \\``, a hyperlink; DCS, SOS, PM and APC strings; two-byte escapes),
then every other C0 / C1 control character and DEL (a newline too: a name is one line), and the Unicode
controls that reorder or hide text (bidirectional overrides and isolates). ``safe`` is ``clean`` with rich's
markup escaped, for a user string placed inside a markup string; ``plain`` is a ``rich.text.Text`` of the
cleaned string, for a table cell or a title (a Text is never read as markup).
"""

from __future__ import annotations

import re
from typing import Any

# string-type sequences run to their terminator (BEL or ST) or, unterminated, to the end of the string
_STRING_SEQ = r"(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f]).*?(?:\x07|\x1b\\|\x9c|$)"
_CSI = r"(?:\x1b\[|\x9b)[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]?"
_ESC2 = r"\x1b[\x20-\x2f]*[\x30-\x7e]?"  # ESC, intermediates, one final byte (ESC c: reset, ESC 7, ...)
_SEQUENCES = re.compile(f"{_STRING_SEQ}|{_CSI}|{_ESC2}", re.S)
# C0, DEL, C1; zero-width and bidirectional format controls (LRM/RLM, LRE..RLO, LRI..PDI, ALM)
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\u061c]")


def clean(s: Any) -> str:
    """``str(s)`` without terminal escape sequences and control characters (see the module docstring)."""
    return _CONTROLS.sub("", _SEQUENCES.sub("", str(s)))


def safe(s: Any) -> str:
    """``clean(s)`` with rich markup escaped: ``[/b]`` prints as ``[/b]`` inside a markup string."""
    from rich.markup import escape

    return escape(clean(s))


def plain(s: Any):
    """A ``rich.text.Text`` of ``clean(s)``: a table cell or title that is never read as markup."""
    from rich.text import Text

    return Text(clean(s))
