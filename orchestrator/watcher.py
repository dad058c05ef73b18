"""A detached watcher: ``python -m orchestrator.watcher RUN [--auto-resume]``.

`wmctl submit --detach --auto-resume` starts it in a session of its own, its output appended to
the run folder's ``watcher.log`` (``wmctl logs RUN --watcher``). It is the library's watch with
ISO 8601 timestamped lines; it outlives the shell that submitted the run.
"""

from __future__ import annotations

import argparse
import sys

from . import api
from .display import PlainDisplay
from .errors import WmctlError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.watcher")
    parser.add_argument("run")
    parser.add_argument("--auto-resume", action="store_true")
    args = parser.parse_args(argv)
    lines = PlainDisplay()
    try:
        return api.watch(args.run, auto_resume=True if args.auto_resume else None, view=lines)
    except WmctlError as exc:
        lines(f"error: {exc}")
        return exc.exit_code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
