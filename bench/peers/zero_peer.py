#!/usr/bin/python3
"""PyTorch's ZeroRedundancyOptimizer recipe on the CPU (gloo): DDP over 20 x Linear(2000, 2000),
Adam, MSE against random targets, global batch 20, once with plain Adam and once with
ZeroRedundancyOptimizer(Adam). The peer bench/zero.sh measures dsgd_zero_bench against. Run
with Debian's /usr/bin/python3 (python3-torch). Prints one JSON object: per run the seconds per
step (median of the timed chunks) and the ranks' largest peak resident memory (ru_maxrss), as
dsgd's peak_rss_mib.

  /usr/bin/python3 bench/peers/zero_peer.py --world-size 2
"""
import argparse, json, os, resource, statistics, sys, threading, time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP


def worker(rank, args, port, zero, out):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=args.world_size)
    torch.manual_seed(1)
    model = DDP(nn.Sequential(*[nn.Linear(args.width, args.width) for _ in range(args.layers)]))
    if zero:
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=args.lr)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    per_rank = 20 // args.world_size
    x, y = torch.randn(per_rank, args.width), torch.randn(per_rank, args.width)

    def step():
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    peak_pss = [0]  # kB, sampled every 100 ms as dsgd_zero_bench samples its workers'

    def sample():
        while not done.is_set():
            with open("/proc/self/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        peak_pss[0] = max(peak_pss[0], int(line.split()[1]))
            done.wait(0.1)

    done = threading.Event()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    for _ in range(2):  # warm-up: the optimizer state exists from here on
        step()
    times = []
    for _ in range(args.chunks):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step()
        times.append((time.perf_counter() - t0) / args.steps)
    done.set()
    sampler.join()
    rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, peak_pss[0] / 1024.0])
    dist.all_reduce(rss, op=dist.ReduceOp.MAX)
    if rank == 0:
        out.put({"zero": 1 if zero else 0, "step_s": statistics.median(times), "peak_rss_mib": rss[0].item(),
                 "peak_pss_mib": rss[1].item()})
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--layers", type=int, default=20)
    p.add_argument("--width", type=int, default=2000)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--chunks", type=int, default=3)
    p.add_argument("--rounds", type=int, default=1)
    args = p.parse_args()
    ctx = mp.get_context("spawn")
    runs = []
    for r in range(args.rounds):
        for zero in (False, True):
            out = ctx.Queue()
            port = 29600 + 2 * r + int(zero) + (os.getpid() % 1000) * 4
            procs = [ctx.Process(target=worker, args=(i, args, port, zero, out)) for i in range(args.world_size)]
            for pr in procs:
                pr.start()
            runs.append(out.get(timeout=600))
            for pr in procs:
                pr.join()
            print(f"pytorch zero {runs[-1]['zero']}: {runs[-1]['step_s']:.3f} s/step, "
                  f"rank peak RSS {runs[-1]['peak_rss_mib']:.0f} MiB, peak PSS {runs[-1]['peak_pss_mib']:.0f} MiB",
                  file=sys.stderr, flush=True)
    print(json.dumps({"world_size": args.world_size, "runs": runs}))


if __name__ == "__main__":
    main()
