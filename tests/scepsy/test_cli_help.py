"""``--help`` in plain text: every command's and sub-command's help (found by walking the
argparse parser, not listed by hand) shows no reStructuredText markup, and
:func:`scepsy.cli.helptext.plain_text`, which every parser's formatter applies, turns the markup
docstrings carry into the words it marks.
"""

from __future__ import annotations

import argparse
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import run_cli
from scepsy.cli import _Parser, build_parser
from scepsy.cli.helptext import plain_text

# double backquotes, a role (:class:`x`, :py:func:`x`), a hyperlink reference (`x`_),
# strong or emphasis around a word (**x**, *x*)
MARKUP = re.compile(r"``|:[A-Za-z][\w.+-]*:`|`_|(?<![\w*])\*{1,2}[^\s*][^*\n]*\*{1,2}(?![\w*])")


def _sub(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _commands() -> list[tuple[str, ...]]:
    """Every command path of ``scepsy`` (``()``, ``("plan",)``, ``("profile", "fit")``, ...),
    from the parser itself: a command's own sub-commands exist once it is the one named."""
    found: list[tuple[str, ...]] = [()]
    todo: list[tuple[str, ...]] = [()]
    while todo:
        path = todo.pop()
        parser = build_parser([*path, "--help"])
        for name in path:
            parser = _sub(parser)[name]
        for name in _sub(parser):
            found.append((*path, name))
            todo.append((*path, name))
    return sorted(found)


COMMANDS = _commands()


def test_the_walk_finds_the_commands_and_their_sub_commands():
    names = {" ".join(p) for p in COMMANDS}
    assert {"plan", "report", "launch", "replan", "profile fit", "profile show",
            "trace import", "trace receive", "bench loop"} <= names
    assert len(COMMANDS) >= 25


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "scepsy")
def test_help_has_no_rst_markup(path):
    code, out, err = run_cli(*path, "--help")
    assert code == 0 and err == ""
    assert out.startswith("usage: scepsy")
    bad = [line for line in out.splitlines() if MARKUP.search(line)]
    assert bad == [], f"scepsy {' '.join(path)} --help:\n" + "\n".join(bad)


def test_a_docstring_help_reaches_the_terminal_as_plain_text(capsys):
    """Any parser of the CLI (a sub-command's too) formats help through plain_text."""
    p = _Parser(prog="scepsy x", description="Reads a ``plan.json`` (:func:`~scepsy.api.plan`).")
    sub = p.add_subparsers()
    cmd = sub.add_parser("y", help="the *fast* path, see :class:`scepsy_place.request.Search`")
    cmd.add_argument("--z", help="``x`` in **bold** (default %(default)s)", default=3)
    text = p.format_help() + cmd.format_help()
    assert "Reads a plan.json (plan)." in text
    assert "the fast path, see scepsy_place.request.Search" in text
    assert "x in bold (default 3)" in text
    assert not MARKUP.search(text)


EXAMPLES = {
    "``scepsy plan``": "scepsy plan",
    ":class:`PlanRequest`": "PlanRequest",
    ":func:`~scepsy.api.plan`": "plan",
    ":py:meth:`the writer <scepsy.api.PlanResult.write>`": "the writer",
    "`the docs <https://example.org>`_": "the docs",
    "**not** *ever*": "not ever",
    "``x``\\ s": "xs",
    "For example::": "For example:",
    # left alone: quoting, arithmetic, globs, a rate like load=W*F, a time like 10:30
    "`scepsy stop DIR`": "`scepsy stop DIR`",
    "2 * 3 * 4": "2 * 3 * 4",
    "*.json files": "*.json files",
    "load=WORKFLOW*F|load=WORKFLOW=RATE": "load=WORKFLOW*F|load=WORKFLOW=RATE",
    "at 10:30: go": "at 10:30: go",
}


@pytest.mark.parametrize("rst", list(EXAMPLES))
def test_plain_text_examples(rst):
    assert plain_text(rst) == EXAMPLES[rst]


WORD = st.text(st.characters(whitelist_categories=("L", "N"), whitelist_characters="._-"),
               min_size=1, max_size=12).filter(lambda w: w[0].isalnum() and w[-1].isalnum())


@settings(max_examples=200, deadline=None)
@given(before=WORD, word=WORD, after=WORD,
       form=st.sampled_from(["``{}``", ":class:`{}`", ":func:`{}`", "*{}*", "**{}**",
                             "`{}`_", ":meth:`~a.b.{}`"]))
def test_plain_text_keeps_the_marked_word(before, word, after, form):
    text = f"{before} {form.format(word)} {after}"
    shown = word.rsplit(".", 1)[-1] if "~" in form else word  # ~ keeps the last dotted part
    assert plain_text(text) == f"{before} {shown} {after}"


@settings(max_examples=200, deadline=None)
@given(st.text(st.characters(blacklist_characters="`*\\:")))
def test_plain_text_leaves_text_without_markup_characters_alone(text):
    assert plain_text(text) == text
