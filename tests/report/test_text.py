"""User strings printed as text: terminal escape sequences and control characters removed, rich markup shown
literally (report.text)."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from opmap.report.text import clean, plain, safe

# ECMA-48: CSI "ESC [" params final (ESC[2J clears the screen), OSC "ESC ]" ... ST (ESC \) or BEL (OSC 8 is
# a hyperlink), the 8-bit CSI 0x9b, a two-byte escape (ESC c resets the terminal), U+202E reverses text
EVIL = ("a\x1b[2Jb\x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\c\x1b]0;title\x07d\x9b31me"
        "\x1bcf\x07\x08\r\n\x00g\u202eh\x7f")


def test_clean_removes_sequences_whole_and_every_control():
    assert clean(EVIL) == "ablinkcdefgh"
    assert clean("plain [/b] name.py:tiny") == "plain [/b] name.py:tiny"  # printable text untouched
    assert clean("unterminated \x1b]8;;http://evil") == "unterminated "  # an OSC never closed runs to the end
    assert clean(42) == "42"


def _render(*items, **kw) -> str:
    buf = io.StringIO()
    Console(file=buf, width=200, color_system=None).print(*items, **kw)
    return buf.getvalue()


def test_safe_shows_markup_literally_inside_markup():
    out = _render(f"[bold]model[/bold] {safe('x[/b]y[red]z' + EVIL)} done")
    assert out == "model x[/b]y[red]zablinkcdefgh done\n"


def test_plain_is_a_table_cell_never_read_as_markup():
    t = Table(title=plain("runs of [/b]"))
    t.add_column("workload")
    t.add_row(plain("[/b]\x1b[2Jm"))
    out = _render(t)
    assert "runs of [/b]" in out and "[/b]m" in out and "\x1b" not in out


def test_md_writes_a_name_as_one_line_of_markdown_text():
    from opmap.report.text import md, md_code

    # each by hand from CommonMark: line breaks a space, <>& entities, punctuation that starts a construct escaped
    assert md("a\n# h\r\n[l](http://x) <img src=x> & www.y.z *e* _u_ `c` | ~s~ $m$ a@b.c !#^\\") == (
        "a \\# h \\[l\\](http:\\/\\/x) &lt;img src=x&gt; &amp; www\\.y.z \\*e\\* \\_u\\_ \\`c\\` \\| \\~s\\~ "
        "\\$m\\$ a\\@b.c \\!\\#\\^\\\\")
    assert md("gpt2 on h100-sxm (prefill, bf16): 1.5 ms") == "gpt2 on h100-sxm (prefill, bf16): 1.5 ms"
    assert md(EVIL) == "ablinkcdef gh"  # the terminal's clean, after the line break became a space
    assert md_code("opmap analyze gpt2") == "`opmap analyze gpt2`"
    assert md_code("a `` b\nc`") == "``` a `` b c` ```"  # a fence longer than any run of backticks inside


def test_plotly_and_matplotlib_text():
    from opmap.report.text import mpl_text, plotly_text

    assert plotly_text('<a href="http://e">x</a>\n&lt;') == '&lt;a href="http://e"&gt;x&lt;/a&gt; &amp;lt;'
    assert mpl_text("$\\frac{1}{$ x\n") == "\\$\\frac{1}{\\$ x "
