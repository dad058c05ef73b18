"""Click parameter types shared by commands."""

from __future__ import annotations

import re

import click

from ..validate import Invalid, parse_duration

_DAYS = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*d\s*$")


class Duration(click.ParamType):
    """A duration such as 90s, 10m, 2h, 1h30m or (for ages) 7d, as seconds."""

    name = "DUR"

    def convert(self, value, param, ctx):
        if isinstance(value, float):
            return value
        days = _DAYS.match(str(value))
        if days:
            return float(days.group(1)) * 86400
        try:
            return parse_duration(value)
        except Invalid as exc:
            self.fail(f"{exc} (or days: 7d)", param, ctx)


def complete_runs(ctx: click.Context, param: click.Parameter, incomplete: str) -> list:
    """Shell completion of a RUN argument: the runs recorded in $WMCTL_HOME (names only; no
    record is read, no backend asked)."""
    from click.shell_completion import CompletionItem

    from ..errors import WmctlError
    from ..state import list_runs

    try:
        names = list_runs()
    except (OSError, WmctlError):
        return []
    return [CompletionItem(name) for name in names if name.startswith(incomplete)]


def run_argument(func):
    """The RUN argument of the commands that act on a recorded run, completing run names."""
    return click.argument("run", shell_complete=complete_runs)(func)
