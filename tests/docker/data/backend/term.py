"""A node that stops gracefully: on SIGTERM it writes a marker into the checkpoint volume and exits
with the runtime's preemption code (83), as a checkpointing job would."""

import os
import signal
import sys
import time

from orchestrator.runtime.protocol import PREEMPTED_EXIT_CODE, format_progress


def on_term(signum, frame):
    os.makedirs(os.environ["WMCTL_CHECKPOINT_DIR"], exist_ok=True)   # started without the launcher here
    with open(os.path.join(os.environ["WMCTL_CHECKPOINT_DIR"], os.environ["WMCTL_NODE_NAME"] + ".term"), "w") as fh:
        fh.write("checkpointed\n")
    sys.exit(PREEMPTED_EXIT_CODE)


signal.signal(signal.SIGTERM, on_term)   # also needed because PID 1 ignores unhandled SIGTERM
print(format_progress("start"), flush=True)
time.sleep(120)
