"""One way to add a command: ``scepsy.cli.COMMANDS`` names its module, whose ``register`` builds
its parser and sets its handler; a command's module (and the library behind it) is imported only
when that command is named."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from scepsy.cli import COMMANDS, build_parser


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _handlers(parser: argparse.ArgumentParser) -> list[object]:
    """The handler of a command, or of each of its sub-commands (recursively)."""
    subs = _subcommands(parser)
    if not subs:
        return [parser.get_default("func")]
    return [h for p in subs.values() for h in _handlers(p)]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_is_built_by_its_module_with_a_handler(name):
    cmd = _subcommands(build_parser([name]))[name]
    handlers = _handlers(cmd)
    assert handlers and all(callable(h) for h in handlers), (name, handlers)


def test_help_imports_no_command_module_and_no_library():
    code = ("import sys, json; from scepsy.cli import build_parser; build_parser(['--help']); "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('scepsy'))))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True,
                                       text=True, check=True).stdout)
    commands = {mod for mod, _ in COMMANDS.values()}
    assert not commands & set(loaded), commands & set(loaded)
    assert not [m for m in loaded if m.split(".")[0] != "scepsy" and m != "scepsy_common"
                and not m.startswith("scepsy_common.")], loaded


def test_naming_one_command_imports_its_module_only():
    code = ("import sys, json; from scepsy.cli import build_parser; build_parser(['gateway']); "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('scepsy.cli.'))))")
    loaded = set(json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True,
                                           text=True, check=True).stdout))
    commands = {mod for mod, _ in COMMANDS.values()}
    assert loaded & commands == {"scepsy.cli.gateway"}, loaded & commands
