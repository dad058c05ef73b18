"""`wmctl completion bash|zsh|fish`: the shell's completion script (Click's shell completion),
completing commands, options and, for RUN arguments, the names of recorded runs.

    eval "$(wmctl completion bash)"        # in ~/.bashrc
"""

from __future__ import annotations

import click

SHELLS = ("bash", "zsh", "fish")
COMPLETE_VAR = "_WMCTL_COMPLETE"    # Click's protocol: _<PROG>_COMPLETE, prog name upper-cased


@click.command("completion", help="Print the shell completion script: eval \"$(wmctl completion bash)\" "
                                  "(zsh: the same; fish: wmctl completion fish | source).")
@click.argument("shell", type=click.Choice(SHELLS))
def command(shell):
    from click.shell_completion import get_completion_class

    from ..cli import cli

    cls = get_completion_class(shell)
    assert cls is not None      # the three Click ships
    click.echo(cls(cli, {}, "wmctl", COMPLETE_VAR).source())
