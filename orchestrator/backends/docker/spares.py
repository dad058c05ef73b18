"""Spare nodes on Docker (restart.spares, docs/spares.md): what a slot's container runs and mounts,
and the attempt's c10d store in a container of its own. Pure: render.py calls it.

Every slot's container (the nodes, then the spares) runs the keeper (runtime/keeper.py) around its
torchrun line; the job's image needs no wmctl of this version for it: keeper.py and c10dstore.py are
single standard-library files bind-mounted read-only from this installation. The attempt's rounds
folder (on this machine, written by the watcher) is mounted read-only; each keeper's pid and exit
files go to the attempt's ``slots`` folder, mounted writable: a round's torchrun that fails leaves
its container running (the keeper waits for the next round), so the engine reads the round's end
from that file, as the local backend does, not from the container's state.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from ... import labels as L
from ... import layout
from ...runtime import c10dstore, keeper
from ...runtime.protocol import ENV_LOCAL_TAG, ENV_NODE_NAME

MOUNT = "/wmctl-spares"
KEEPER = f"{MOUNT}/keeper.py"
STORE = f"{MOUNT}/c10dstore.py"
ROUNDS = f"{MOUNT}/rounds"
SLOTS = f"{MOUNT}/slots"
STORE_NODE = "store"          # the store container's wmctl.io/node label (never a number: no node of the attempt)
PYTHON_WORD = "@python"       # the word of a keeper's torchrun line the script replaces with the image's python
SLOTS_DIR = "slots"           # the attempt folder's subfolder the keepers write their pid and exit files to

# POSIX shell, given the program's argv as positional parameters (nothing is spliced into it): the
# image's python (python3, else python), put in place of the first PYTHON_WORD, then exec'd with the
# rest. torchrun is run as `python -m torch.distributed.run`, so the keeper imports it while its slot
# waits and forks it for each round (keeper.prewarm): no torch import on the recovery's path.
PYTHON_SH = (
    'p=$(command -v python3 || command -v python) || '
    '{ echo "wmctl: the image has no python3 or python to run the spare-node keeper" >&2; exit 127; }\n'
    'o=1\n'
    'for a; do shift\n'
    f'  if [ "$o" = 1 ] && [ "$a" = {PYTHON_WORD} ]; then a=$p; o=0; fi\n'
    '  set -- "$@" "$a"\n'
    'done\n'
    'exec "$p" "$@"\n'
)


def store_name(run: str, attempt: int) -> str:
    return f"{layout.attempt_name(run, attempt)}-{STORE_NODE}"


def slots_dir(run: str, attempt: int, home: Path | None = None) -> Path:
    return layout.attempt_dir(run, attempt, home) / SLOTS_DIR


def exit_file(slot: int) -> str:
    return f"slot-{slot}.exit.json"


def pid_file(slot: int) -> str:
    return f"slot-{slot}.pid.json"


def source_files() -> tuple[str, str]:
    """keeper.py and c10dstore.py of this installation (bind-mounted into the containers)."""
    return str(Path(keeper.__file__).resolve()), str(Path(c10dstore.__file__).resolve())


def mounts(run: str, attempt: int, home: Path | None) -> list[dict[str, Any]]:
    """A slot container's: the keeper, and the rounds folder, read-only; the slots folder writable."""
    keeper_py, _ = source_files()
    return [{"Target": KEEPER, "Source": keeper_py, "Type": "bind", "ReadOnly": True},
            {"Target": ROUNDS, "Source": str(layout.rounds_dir(run, attempt, home)), "Type": "bind",
             "ReadOnly": True},
            {"Target": SLOTS, "Source": str(slots_dir(run, attempt, home)), "Type": "bind", "ReadOnly": False}]


def keeper_command(slot: int, torchrun_argv: list[str]) -> list[str]:
    """A slot container's command: the keeper of ``slot`` around ``torchrun_argv``, whose first
    word is PYTHON_WORD (``@python -m torch.distributed.run ...``). The keeper's log is its
    container's stdout (`docker logs`, and the watcher's progress), '-'."""
    return ["sh", "-c", PYTHON_SH, "wmctl-keeper", KEEPER, "--rounds", ROUNDS, "--slot", str(slot),
            "--log", "-", "--exit-file", f"{SLOTS}/{exit_file(slot)}", "--pid-file", f"{SLOTS}/{pid_file(slot)}",
            "--", *torchrun_argv]


def store_container(run: str, attempt: int, *, image: str, port: int, network: str, user: str | None,
                    env: dict[str, str], spec_hash: str) -> dict[str, Any]:
    """The attempt's c10d store (runtime/c10dstore.py) in a container of its own on the attempt's
    network, labelled as the attempt's, so cancel, teardown and the sweeps find it; its
    wmctl.io/node label is 'store', so nothing counts it as a node."""
    name = store_name(run, attempt)
    create: dict[str, Any] = {
        "name": name, "image": image, "command": ["sh", "-c", PYTHON_SH, "wmctl-store", STORE, "--port", str(port)],
        "hostname": name, "environment": env,
        "labels": {**L.run_labels(run, attempt), L.NODE: STORE_NODE, L.SPEC_HASH: spec_hash},
        "working_dir": "/", "shm_size": 64 * 2**20,
        "mounts": [{"Target": STORE, "Source": source_files()[1], "Type": "bind", "ReadOnly": True}],
        "network": network, "stop_signal": "SIGTERM", "stop_timeout": 10,
    }
    if user is not None:
        create["user"] = user
    return create


def for_slot(resource: dict[str, Any], run: str, attempt: int, slot: int) -> dict[str, Any]:
    """A plan's slot container (a lost node's) made over for a new spare in slot ``slot``
    (replenishing): its name, hostname, labels, tag and keeper's slot are the new slot's; its CPUs,
    devices, mounts and torchrun line stay (the lost node's, free now)."""
    create = copy.deepcopy(resource["create"])
    name = layout.node_name(run, attempt, slot)
    argv = create["command"]
    torchrun = argv[argv.index("--", argv.index("--pid-file")) + 1:]
    create.update(name=name, hostname=name, command=keeper_command(slot, torchrun))
    create["labels"] = {**create["labels"], L.NODE: str(slot), L.NODES: str(slot + 1)}
    create["environment"] = {**create["environment"], ENV_NODE_NAME: name, ENV_LOCAL_TAG: name}
    return {**resource, "node": slot, "spare": True, "replenished": True, "aliases": [name], "create": create}
