"""The c10d store of an attempt with spare nodes, in a process (or container, or pod) of its own.

With c10d rendezvous the store normally lives in the agent at ``--rdzv-endpoint`` (node 0's), so
node 0's death ends every agent. With ``restart.spares`` the local backend starts this process
beside the nodes instead (the agents connect with ``is_host=false``): any node, node 0 included,
can die and the others and the spare still meet in the next round. If this process itself dies,
every agent loses the rendezvous, the attempt fails, and the supervisor resubmits as it always
did (the next attempt starts a new store). Tagged like the nodes, so teardown finds it.
"""

from __future__ import annotations

import argparse
import datetime
import signal
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="wmctl-local-store")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", args.port, is_master=True, wait_for_workers=False,
                     timeout=datetime.timedelta(seconds=60))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while store is not None:   # the server thread serves; this one waits for teardown's signal
        signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main())
