"""User strings made safe for the terminal: module and class names, file names, workload names and run tags
come from users (a model file, a trace, a run store) and are printed as text, never as rich markup or as
terminal commands.

``clean`` removes what a terminal would act on: escape sequences whole (CSI such as ``ESC [2J``, clear
screen; OSC such as ``ESC ]8;;URL ESC \\``, a hyperlink; DCS, SOS, PM and APC strings; two-byte escapes),
then every other C0 / C1 control character and DEL (a newline too: a name is one line), and the Unicode
controls that reorder or hide text (bidirectional overrides and isolates). ``safe`` is ``clean`` with rich's
markup escaped, for a user string placed inside a markup string; ``plain`` is a ``rich.text.Text`` of the
cleaned string, for a table cell or a title (a Text is never read as markup).

The same strings in files and figures (a run's model id, a server's name, an imported tag): ``one_line`` is
``clean`` with each line break a space first; ``md`` is a one-line string as Markdown text that renders as
itself (no heading, list, link, image, emphasis, table cell or raw HTML can start in it); ``md_code`` the same
as a code span; ``plotly_text`` for a Plotly title, legend name, category or hover text (Plotly draws ``<a
href>``, ``<b>`` and ``<br>`` there: ``<``, ``>`` and ``&`` are written as entities, which it shows as text);
``mpl_text`` for a matplotlib label (a ``$`` would start mathtext).
"""

from __future__ import annotations

import html
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


_BREAKS = re.compile("[\n\r\x0b\x0c\x1c-\x1e\x85\u2028\u2029]+")
# what can start Markdown inside a line: escapes, code, emphasis, links and images, table cells, strikethrough,
# math ($, GitHub), autolinked e-mail (@), headings and footnotes; each is written backslash-escaped
_MD_PUNCT = re.compile(r"[\\`*_\[\]|~$@#!^]")
_WWW = re.compile(r"(?i)\bwww\.")


def one_line(s: Any) -> str:
    """``clean(s)`` with every line break (a run of them) turned into one space first: a name is one line."""
    return clean(_BREAKS.sub(" ", str(s)))


def md(s: Any) -> str:
    """``s`` as one line of Markdown text that renders as itself: control characters and line breaks gone (no
    new line, so no heading, list or table row), ``<``, ``>`` and ``&`` as HTML entities (no raw HTML, no
    entity), Markdown punctuation backslash-escaped (no link, image, emphasis, code, cell border), and the URL
    and www. forms GitHub would link written so that it does not."""
    t = one_line(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    t = _MD_PUNCT.sub(lambda m: "\\" + m.group(0), t)
    return _WWW.sub(lambda m: m.group(0)[:-1] + "\\.", t.replace("://", ":\\/\\/"))


def md_code(s: Any) -> str:
    """``s`` as one Markdown code span (a command to copy): one line, fenced by more backticks than it holds in
    a row, so nothing in it closes the span early."""
    t = one_line(s)
    longest = max((len(r) for r in re.findall("`+", t)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if t.startswith("`") or t.endswith("`") else ""
    return f"{fence}{pad}{t}{pad}{fence}"


def plotly_text(s: Any) -> str:
    """``s`` as Plotly text (a title, a legend name, a category, hover text): one line, ``<``, ``>`` and ``&`` as
    entities, so no tag of Plotly's (``<a href>``, ``<br>``, ``<b>``) is read from it."""
    return html.escape(one_line(s), quote=False)


def mpl_text(s: Any) -> str:
    """``s`` as matplotlib text: one line, ``$`` escaped (a pair would be parsed as mathtext)."""
    return one_line(s).replace("$", "\\$")
