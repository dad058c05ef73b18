"""A training script as users first bring it: no orchestrator.runtime, no progress lines, only its
own prints. Prints a line every --sleep seconds for --steps lines, then exits 0."""

import argparse
import time

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=8)
ap.add_argument("--every", type=int, default=1)
ap.add_argument("--sleep", type=float, default=1.0)
# A flag torchrun's parser would take for an abbreviation of its own (--nnodes, --no-python, ...)
# if it reached it: the tests pass it to prove the user's arguments reach the program intact.
ap.add_argument("--n", type=int, default=None)
args = ap.parse_args()
if args.n is not None:
    print(f"my own args: --n {args.n}", flush=True)
for step in range(1, args.steps + 1):
    time.sleep(args.sleep)
    print(f"my own log: step {step} loss {1.0 / step:.3f}", flush=True)
