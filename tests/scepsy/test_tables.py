"""The CLI's one table renderer and progress display (scepsy.tables, built on rich)."""

from __future__ import annotations

import io
import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from scepsy.tables import format_cell, format_table, print_table, progress


class _Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


ROWS = [
    {"model": "llama-7b", "tp": 1, "share": 0.5, "mu": 12.3456789, "note": None},
    {"model": "qwen2.5-72b-instruct-a-long-name", "tp": 8, "share": 1.0, "mu": float("inf"),
     "note": "[bold]not markup[/bold]"},
    {"model": "m", "tp": 16, "share": 1e-07, "mu": -float("inf"), "note": ":smile:"},
]
COLS = ["model", "tp", "share", "mu", "note"]

EXPECTED = """\
                           model  tp  share       mu                     note
                        llama-7b   1    0.5  12.3457                        -
qwen2.5-72b-instruct-a-long-name   8      1      inf  [bold]not markup[/bold]
                               m  16  1e-07     -inf                  :smile:"""


def test_table_numbers_none_long_strings_exact():
    assert format_table(ROWS, COLS) == EXPECTED


def test_table_left_aligned_has_no_trailing_spaces():
    text = format_table([{"a": "x", "bb": 1}, {"a": "long", "bb": 22}], ["a", "bb"],
                        align="left")
    assert text == "a     bb\nx     1\nlong  22"


def test_print_table_pipe_is_format_table(capsys):
    print_table(ROWS, COLS)
    assert capsys.readouterr().out == EXPECTED + "\n"


def test_print_table_terminal_same_layout_bold_header():
    term = _Terminal()
    print_table(ROWS, COLS, file=term)
    out = term.getvalue()
    assert "\x1b[1m" in out  # bold header
    plain = "\n".join(ln.rstrip() for ln in _strip_ansi(out).splitlines())
    assert plain == EXPECTED


def _strip_ansi(text: str) -> str:
    import re

    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)


def test_format_cell():
    assert [format_cell(v) for v in (None, 1.5, 2.0, 1e6, float("inf"), -float("inf"),
                                     float("nan"), 3, "x")] == \
        ["-", "1.5", "2", "1e+06", "inf", "-inf", "nan", "3", "x"]


def _reference(rows, cols):
    """Oracle: right-aligned columns padded to the widest cell, two spaces apart."""
    cells = [[format_cell(r[c]) for c in cols] for r in rows]
    widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(cols)]
    lines = [[c.rjust(w) for c, w in zip(cols, widths, strict=True)]]
    lines += [[v.rjust(w) for v, w in zip(row, widths, strict=True)] for row in cells]
    return "\n".join("  ".join(line) for line in lines)


_word = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=30)
_value = st.one_of(st.none(), st.integers(-10**9, 10**9),
                   st.floats(allow_nan=False), _word)


@settings(derandomize=True, max_examples=60, deadline=None)
@given(cols=st.lists(_word, min_size=1, max_size=5, unique=True), data=st.data())
def test_table_matches_reference_layout(cols, data):
    rows = data.draw(st.lists(st.fixed_dictionaries({c: _value for c in cols}), max_size=6))
    text = format_table(rows, cols)
    assert text == _reference(rows, cols)
    # every line parses back into the cells, in column order
    lines = text.splitlines()
    assert lines[0].split() == cols
    assert [ln.split() for ln in lines[1:]] == [[format_cell(r[c]) for c in cols] for r in rows]


def test_progress_silent_when_not_a_terminal(capsys):
    with progress("planning", total=3) as task:
        for _ in range(3):
            task.advance()
        task.update(description="placing", completed=3)
    with progress("spinner") as task:
        task.advance()
    assert capsys.readouterr() == ("", "")


def test_progress_silent_when_quiet_on_a_terminal():
    term = _Terminal()
    with progress("planning", total=2, quiet=True, file=term) as task:
        task.advance(2)
    assert term.getvalue() == ""


def test_progress_shows_on_a_terminal_and_erases_itself():
    term = _Terminal()
    with progress("fitting curves", total=4, file=term) as task:
        task.advance(4)
    out = _strip_ansi(term.getvalue())
    assert "fitting curves" in out
    assert "4/4" in out
    term = _Terminal()
    with progress("planning", file=term) as task:  # no total: a spinner, then a new stage
        task.update(description="placing")
    assert "placing" in _strip_ansi(term.getvalue())


def test_rich_is_imported_lazily():
    """Importing the module, and a silent progress display, load no part of rich."""
    code = ("import sys, scepsy.tables as t\n"
            "with t.progress('x', 3) as task: task.advance()\n"
            "print(any(m == 'rich' or m.startswith('rich.') for m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
