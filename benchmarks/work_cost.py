"""What building a trial's work costs before anything trains: drawing the initial weights and
hashing them, on one thread and on all of this machine's cores, in one run.

    python benchmarks/work_cost.py                          # gpt2-xl, one thread and all
    python benchmarks/work_cost.py --models gpt3-13b --all-threads-only

Every worker draws and hashes the full model (`xbench.contract.work`): for gpt3-13b that is
51 GB of float32 in each rank. Large arrays are drawn in chunks and hashed in blocks on threads
side by side; the values and the hash are the same on one thread as on many, which this
script checks. Prints seconds per step and the ratio one thread / all threads.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from xbench.contract.work import hash_arrays, init_weights  # noqa: E402
from xbench.models import usable_cores  # noqa: E402
from xbench.models.model_spec import preset_model  # noqa: E402


def timed(model, threads: int | None) -> tuple[float, float, str]:
    """Seconds to draw and to hash `model`'s weights (threads None: all cores), and the hash."""
    with mock.patch("xbench.models.usable_cores", (lambda: threads) if threads else usable_cores):
        started = time.perf_counter()
        arrays = init_weights(model, 0)
        drawn = time.perf_counter()
        digest = hash_arrays(arrays)
        hashed = time.perf_counter()
    return drawn - started, hashed - drawn, digest


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["gpt2-xl"])
    parser.add_argument("--all-threads-only", action="store_true", help="skip the one-thread run (minutes at 13 B)")
    args = parser.parse_args()
    print(f"{usable_cores()} cores for this process")
    timed(preset_model("gpt2-small"), None)  # warm-up: the first draw of a process is the slowest
    ok = True
    for name in args.models:
        model = preset_model(name)
        draw, hashing, digest = timed(model, None)
        line = f"{name} ({model.params:,} parameters): all threads: draw {draw:.1f} s, hash {hashing:.1f} s"
        if not args.all_threads_only:
            draw1, hashing1, digest1 = timed(model, 1)
            ok &= digest1 == digest
            line += (f"; one thread: draw {draw1:.1f} s, hash {hashing1:.1f} s; ratio one/all: draw "
                     f"{draw1 / draw:.1f}x, hash {hashing1 / hashing:.1f}x; same weights: {digest1 == digest}")
        print(line, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
