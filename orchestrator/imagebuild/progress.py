"""Build and push progress: live on a terminal (rich), plain lines elsewhere."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from typing import IO



TAIL_LINES = 25


# ---- progress ----------------------------------------------------------------------------------------

# The legacy builder colours a step's stderr red with raw escape codes.
ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
STEP_RE = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
MISSING_WHEEL_RE = re.compile(r"No matching distribution found for ([^\s]+)")
NO_VERSION_RE = re.compile(r"Could not find a version that satisfies the requirement ([^\s]+)")


@dataclass
class Step:
    number: int
    total: int
    instruction: str
    cached: bool = False
    output: list[str] = field(default_factory=list)


def short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit - 70] + " ... " + text[-65:]


class Reporter:
    """Plain lines (CI logs, pipes); ``quiet`` keeps only results and errors."""

    def __init__(self, stream: IO[str] | None = None, quiet: bool = False):
        self.stream = stream or sys.stdout
        self.quiet = quiet

    def step(self, step: Step) -> None:
        if not self.quiet:
            self._print(f"Step {step.number}/{step.total} : {short(step.instruction)}")

    def line(self, text: str) -> None:
        if not self.quiet:
            self._print(text)

    def status(self, text: str) -> None:
        if not self.quiet:
            self._print(text)

    def result(self, text: str) -> None:
        self._print(text)

    def close(self) -> None:
        pass

    def __enter__(self) -> "Reporter":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _print(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()


class RichReporter(Reporter):
    """A live spinner with the current step, the step list scrolling above it."""

    def __init__(self) -> None:
        from rich.console import Console

        super().__init__()
        self.console = Console()
        self._status = self.console.status("starting build")
        self._status.start()
        self._running = True

    def step(self, step: Step) -> None:
        self.console.print(f"[bold]Step {step.number}/{step.total}[/bold] {short(step.instruction, 110)}",
                           markup=True, highlight=False)
        self._status.update(f"step {step.number}/{step.total}")

    def line(self, text: str) -> None:
        if "Using cache" in text:
            self.console.print("  [green]cached[/green]", markup=True)
        elif text.startswith(" ---> ") or text.startswith("Removing intermediate"):
            return
        else:
            self.console.print(f"  [dim]{_escape(text)}[/dim]", markup=True, highlight=False)

    def status(self, text: str) -> None:
        self._status.update(text)

    def result(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False)

    def close(self) -> None:
        # Called by build_image, push_image and the command's `with`: stop the live display once.
        if self._running:
            self._running = False
            self._status.stop()


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def make_reporter(quiet: bool) -> Reporter:
    if not quiet and sys.stdout.isatty():
        return RichReporter()
    return Reporter(quiet=quiet)
