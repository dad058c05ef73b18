"""Every error a user can cause or meet, each with a message and an exit code.

The CLI prints ``WmctlError`` subclasses as one clear message (no traceback unless --debug)
and exits with ``exit_code``. Anything else escaping is a bug in wmctl.
"""

from __future__ import annotations


class WmctlError(Exception):
    """Base class: a failure wmctl can explain to the user."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message}\n  hint: {self.hint}" if self.hint else self.message


class SpecError(WmctlError):
    """The job spec (or a flag overriding it) is invalid. Nothing was submitted."""

    exit_code = 2

    SHOWN_CHARS = 1500      # hostile input (a 300 KiB value, thousands of bad keys) stays a short message

    def __init__(self, problems: list[tuple[str, str]]):
        # problems: (field path, what is wrong and how to fix it)
        self.problems = problems
        lines: list[str] = []
        for path, msg in problems:
            line = f"  {_cut(path, 80)}: {_cut(msg, 400)}"
            if lines and sum(map(len, lines)) + len(line) > self.SHOWN_CHARS:
                lines.append(f"  ... and {len(problems) - len(lines)} more problem(s): fix these first")
                break
            lines.append(line)
        super().__init__("invalid job spec:\n" + "\n".join(lines))


def _cut(text: str, limit: int) -> str:
    """A short, marked excerpt: the start of ``text`` and how much was left out."""
    text = str(text)
    return text if len(text) <= limit else f"{text[:limit]}... [{len(text) - limit} more characters]"


class OptionError(WmctlError):
    """A command's option or argument is invalid (``--mode``, ``--shm-min``, ``--build-arg``...).
    Nothing was done: the same exit code as an invalid spec, and as Click's own usage errors."""

    exit_code = 2


class ProfileError(WmctlError):
    """A vendor profile file is missing or malformed."""

    exit_code = 2


class BuildError(WmctlError):
    """An image build or push failed."""

    exit_code = 3


class BackendError(WmctlError):
    """A backend (local, Docker, Kubernetes) refused or failed an operation."""

    exit_code = 4


class RunExists(WmctlError):
    """The run's name is taken: a run of that name has not ended, or the backend holds objects of
    that name that no record here knows. Nothing was submitted. The same exit code as a backend's
    refusal: the submit was refused, and a retry after the old run ends (or a new name) succeeds."""

    exit_code = 4


class EngineUnavailable(BackendError):
    """The Docker engine or Kubernetes API cannot be reached."""

    exit_code = 5


class CredentialsRejected(EngineUnavailable):
    """The Kubernetes API answers 401 to a credential that was loaded again: it expired for good
    (an id-token, a rotated token file no longer renewed) and a person must renew it. The run
    itself is untouched; a watcher waits as it waits out any loss of contact."""


class RunNotFound(WmctlError):
    """No run of that name is recorded here."""

    exit_code = 6


class NodeNotRemembered(WmctlError):
    """`wmctl nodes forgive NODE`: no remembered exclusion names that node (of that cluster)."""

    exit_code = 6


class RecordDamaged(RunNotFound):
    """A run's record exists but cannot be read (truncated, edited, from a newer wmctl)."""


class RunCancelled(WmctlError):
    """The run was cancelled (`wmctl cancel`): it ended as asked, not as a failure."""

    exit_code = 8


class RunFailed(WmctlError):
    """A supervised run ended without success (app error, retry budget spent, ...)."""

    exit_code = 7


class MachineUnfit(WmctlError):
    """`wmctl doctor` ran its checks and found errors on this machine (devices, /dev/shm, dtype,
    vendor runtime): the check itself worked, so this is not an unexpected failure (1)."""

    exit_code = 9


class MissingExtra(WmctlError):
    """An optional extra this command needs is not installed (`wmctl plot` without matplotlib):
    nothing was done; the message names the `pip install 'wmctl[...]'` that fixes it."""

    exit_code = 10
