"""A reference all-reduce through torch.distributed and NCCL, timed the way nccl-tests does.

One process per GPU; float32 SUM in place; per size, `warmup` operations, then `repeats`
windows of `iters` operations, each window ended by a device sync. Prints JSON (rank 0):
[{"nbytes", "time_s_median", "algbw_GBps", "busbw_GBps"}], busbw = algbw * 2(n-1)/n.

    python benchmarks/nccl_reference.py --sizes 217612 8085516 1GiB
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from xbench.results.allreduce import bus_factor, parse_size


def rank_main(rank: int, world: int, sizes: list[int], args: argparse.Namespace, queue) -> None:
    import torch
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(args.port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device(f"cuda:{rank}"))
    results = []
    for nbytes in sizes:
        x = torch.ones(nbytes // 4, dtype=torch.float32, device=f"cuda:{rank}")
        for _ in range(args.warmup):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        dist.barrier()
        per_op = []
        for _ in range(args.repeats):
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(args.iters):
                dist.all_reduce(x)
            torch.cuda.synchronize()
            per_op.append((time.perf_counter() - start) / args.iters)
        median = statistics.median(per_op)
        results.append({"nbytes": nbytes, "time_s_median": median, "algbw_GBps": nbytes / median / 1e9,
                        "busbw_GBps": nbytes / median / 1e9 * bus_factor(world)})
        del x
    if rank == 0:
        queue.put(results)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["1GiB"])
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--port", type=int, default=29533)
    args = parser.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off on shared hosts
    import torch.multiprocessing as mp

    sizes = [parse_size(s) for s in args.sizes]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, args.gpus, sizes, args, queue)) for r in range(args.gpus)]
    for p in procs:
        p.start()
    results = queue.get(timeout=600)
    for p in procs:
        p.join(timeout=60)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
