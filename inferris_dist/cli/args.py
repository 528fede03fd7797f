"""What every command shares: exit statuses, a one-line usage error, argument types."""
from __future__ import annotations

import argparse

from inferris_dist.protocol.limits import MAX_SECONDS, int_arg, seconds_arg, valid_seconds

__all__ = ["EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_TERMINATED", "EXIT_USAGE", "MAX_SECONDS",
           "Commands", "Parser", "Terminated", "UsageError", "int_arg", "seconds_arg", "valid_seconds"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_TERMINATED = 0, 1, 2, 130, 143


class UsageError(Exception):
    pass


class Terminated(BaseException):
    """SIGTERM: unwind like Ctrl-C so every worker is stopped on the way out."""


class Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line and exit status 2, takes a long flag only
    as it is spelled (`--world 4` is no `--world-size 4`), and names the closest flags of a
    command to one it does not know, or the commands a flag belongs to."""

    def __init__(self, *args, **kw):
        kw.setdefault("allow_abbrev", False)
        super().__init__(*args, **kw)
        self.commands: Commands | None = None   # a command's parser: every command, to name a flag's

    def error(self, message: str):
        raise UsageError(f"{self.prog}: {message}")

    def _check_value(self, action, value):
        """A command it does not know: the closest it does (argparse's own says only its list)."""
        if isinstance(action, Commands) and value not in action.choices:
            import difflib
            names = list(action.choices)
            close = difflib.get_close_matches(value, names, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}?" if close else f"one of {', '.join(names)}"
            self.error(f"unknown command {value!r} ({hint})")
        super()._check_value(action, value)

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras and self.commands is not None:     # a command's own flags: say which are not
            self.error(self.unknown(extras))
        return namespace, extras

    def unknown(self, extras: list[str]) -> str:
        import difflib
        flags = [x.split("=", 1)[0] for x in extras if x.startswith("-")]
        if not flags:
            return f"unrecognized arguments: {' '.join(extras)}"
        flag = flags[0]
        every = self.commands.every() if self.commands is not None else {}
        elsewhere = sorted(name for name, p in every.items()
                           if p is not self and flag in p._option_string_actions)
        if elsewhere:
            names = " and ".join([", ".join(elsewhere[:-1]), elsewhere[-1]] if len(elsewhere) > 1
                                 else elsewhere)
            return f"{flag} is a flag of {names}, not of {self.prog.rsplit(' ', 1)[-1]}"
        mine = [o for o in self._option_string_actions if o.startswith("--") and o != "--help"]
        close = difflib.get_close_matches(flag, mine, n=3, cutoff=0.6)
        if close:                   # the closest, and only those as close as it: no runner-up
            best = difflib.SequenceMatcher(None, flag, close[0]).ratio()
            close = [c for c in close if difflib.SequenceMatcher(None, flag, c).ratio() == best]
        else:
            close = sorted(o for o in mine if o.startswith(flag))[:3]
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
        return f"unknown flag {flag}{hint}"


class Commands(argparse._SubParsersAction):
    """The subcommands, each one's flags added only when it is the one used, or when a flag
    unknown to one command must be looked for in the others: `--help` lists the commands from
    their lines alone, and `--version` builds nothing. (argparse's own subcommand action,
    which builds nothing itself: it picks the parser by name, as here.)"""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self._unbuilt: dict = {}

    def add_command(self, name: str, help_line: str, build) -> Parser:
        parser = self.add_parser(name, help=help_line)
        parser.commands = self
        self._unbuilt[name] = build
        return parser

    def built(self, name: str) -> Parser:
        build = self._unbuilt.pop(name, None)
        if build is not None:
            build(self._name_parser_map[name])
        return self._name_parser_map[name]

    def every(self) -> dict:
        for name in list(self._unbuilt):
            self.built(name)
        return self._name_parser_map

    def __call__(self, parser, namespace, values, option_string=None):
        if values and values[0] in self._name_parser_map:
            self.built(values[0])
        super().__call__(parser, namespace, values, option_string)
