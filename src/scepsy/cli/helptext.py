"""Help text as a terminal shows it: reStructuredText markup taken from docstrings (a request
field's docstring is its option's help, a module's first line a command's description) turned
into plain text in one place, the formatter every ``scepsy`` parser uses
(:class:`PlainHelpFormatter`).

:func:`plain_text` drops the markup and keeps the words: ````x```` and ``*x*``/``**x**`` become
``x``; a role (``:class:`x```, ``:func:`~a.b.f```, ``:py:meth:`title <a.b>```) becomes its
target (the last part with ``~``) or its title; a hyperlink reference (```x <url>`_``) its
text; an escaped space (``\\ ``) nothing; a literal-block marker ``::`` ending a line ``:``.
A single backquote pair (```x```) is left as it is: plain quoting of a command or a file in
a terminal.
"""

from __future__ import annotations

import argparse
import re

__all__ = ["PlainHelpFormatter", "plain_text"]

_ROLE = re.compile(r":(?:[A-Za-z][\w.+-]*:)+`([^`]+)`")
_LITERAL = re.compile(r"``(.+?)``", re.S)
_LINK = re.compile(r"`([^`<]+?)\s*(?:<[^`>]*>)?`__?(?!\w)")
_STRONG = re.compile(r"(?<![\w*\\])\*\*(?=\S)(.+?)(?<=\S)\*\*(?![\w*])", re.S)
_EMPHASIS = re.compile(r"(?<![\w*\\])\*(?=[^\s*])([^*]*?)(?<=[^\s*])\*(?![\w*])")
_TITLED = re.compile(r"^(.*?)\s*<[^<>]*>$", re.S)


def _role(m: re.Match[str]) -> str:
    body = m.group(1)
    titled = _TITLED.match(body)
    if titled is not None and titled.group(1):
        return titled.group(1)
    body = body.removeprefix("!")
    if body.startswith("~"):
        return body[1:].rsplit(".", 1)[-1]
    return body


def plain_text(text: str) -> str:
    """``text`` without reStructuredText inline markup (module docstring)."""
    if not any(c in text for c in "`*\\:"):
        return text
    text = _ROLE.sub(_role, text)
    text = _LITERAL.sub(r"\1", text)
    text = _LINK.sub(r"\1", text)
    text = _STRONG.sub(r"\1", text)
    text = _EMPHASIS.sub(r"\1", text)
    text = text.replace("\\ ", "")
    return re.sub(r"(?<=\S)::(?=\s*$)", ":", text, flags=re.M)


class PlainHelpFormatter(argparse.HelpFormatter):
    """argparse's formatter with every description, epilog and option or command help passed
    through :func:`plain_text` before it is wrapped."""

    def _format_text(self, text: str) -> str:
        return super()._format_text(plain_text(text))

    def _expand_help(self, action: argparse.Action) -> str:
        return plain_text(super()._expand_help(action))
