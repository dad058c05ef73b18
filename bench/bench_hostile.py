"""How long wmctl takes to refuse each hostile input of tests/unit/test_hostile_input.py, as a
user meets it: `wmctl submit SPEC` in a fresh process, until it exits 2. Prints every case and the
slowest; asserts nothing. Goal: the slowest under 1 s (before the bounded loader an alias bomb
ran past 60 s and printed 34.7 MB).

    PYTHONPATH=. python bench/bench_hostile.py [--trials 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.unit.test_hostile_input import CASES, UNREACHABLE  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, **UNREACHABLE, "WMCTL_HOME": str(Path(tmp) / "home"), "PYTHONPATH": str(REPO)}
        (Path(tmp) / "train.py").write_text("print('hi')\n")
        for name, (text, backend, _) in sorted(CASES.items()):
            spec = Path(tmp) / f"{name}.yaml"
            spec.write_text(text, encoding="utf-8")
            times, size, code = [], 0, None
            for _ in range(args.trials):
                start = time.perf_counter()
                out = subprocess.run([sys.executable, "-m", "orchestrator.cli", "submit", str(spec), "-b", backend],
                                     capture_output=True, env=env, cwd=tmp)
                times.append(time.perf_counter() - start)
                size, code = len(out.stdout) + len(out.stderr), out.returncode
            rows.append((statistics.median(times), name, code, size, len(text)))
    print(f"{'case':<28} {'input':>9} {'exit':>4} {'message':>8} {'median s':>9}")
    for t, name, code, size, given in sorted(rows, key=lambda r: r[1]):
        print(f"{name:<28} {given:>9} {code:>4} {size:>8} {t:>9.3f}")
    slowest = max(rows)
    print(f"slowest: {slowest[1]} {slowest[0]:.3f} s (goal < 1 s); largest message {max(r[3] for r in rows)} bytes")


if __name__ == "__main__":
    main()
