#!/usr/bin/python3
"""PyTorch DDP (gloo backend) training the same CNN or MLP on Fashion-MNIST as `dsgd train`:
the peer that bench/train_peers.sh measures dsgd against. Run with Debian's /usr/bin/python3
(python3-torch). Prints a JSON summary shaped like dsgd train's.

  /usr/bin/python3 bench/peers/ddp_train.py --world-size 2 --model cnn --batch-size 64 --epochs 1

--batch-size is per worker; samples/s counts the training loop only (not data loading or
evaluation); history[i].train_s is cumulative, so time to an accuracy can be read off it.
"""
import argparse, gzip, json, os, struct, sys, time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

MEAN, STD = 0.2860, 0.3530  # the normalisation dsgd's loader applies


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    dims = magic & 0xFF
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    return torch.frombuffer(bytearray(data[4 + 4 * dims:]), dtype=torch.uint8).reshape(shape)


def load(data_dir, split):
    prefix = "train" if split == "train" else "t10k"
    x = read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz")).float().div(255)
    y = read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz")).long()
    return ((x - MEAN) / STD).unsqueeze(1), y


class Cnn(nn.Module):  # pytorch/examples mnist, as src/models/cnn.cpp
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 32, 3), nn.Conv2d(32, 64, 3)
        self.dropout1, self.dropout2 = nn.Dropout(0.25), nn.Dropout(0.5)
        self.fc1, self.fc2 = nn.Linear(9216, 128), nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        x = self.dropout2(F.relu(self.fc1(self.dropout1(x).flatten(1))))
        return self.fc2(x)


class Mlp(nn.Module):  # 784-2048-2048-10, as src/models/mlp.cpp
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(784, 2048), nn.Linear(2048, 2048), nn.Linear(2048, 10)

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x.flatten(1))))))


def worker(rank, args, port, out):
    torch.set_num_threads(args.threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=args.world_size)
    torch.manual_seed(args.seed)
    x, y = load(args.data_dir, "train")
    tx, ty = load(args.data_dir, "test")
    model = Cnn() if args.model == "cnn" else Mlp()
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=args.momentum)
    n, b, w = x.shape[0], args.batch_size, args.world_size
    steps_per_epoch = n // (b * w)
    history, train_s, steps, samples = [], 0.0, 0, 0
    for epoch in range(args.epochs):
        g = torch.Generator().manual_seed(args.seed * 1000 + epoch)
        order = torch.randperm(n, generator=g)  # the same on every rank; each takes its slice
        for group in opt.param_groups:
            group["lr"] = args.lr * args.lr_decay ** epoch
        ddp.train()
        dist.barrier()
        t0 = time.perf_counter()
        for s in range(steps_per_epoch):
            if args.max_steps and steps >= args.max_steps:
                break
            idx = order[(s * w + rank) * b:(s * w + rank + 1) * b]
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
                loss = F.cross_entropy(ddp(x[idx]), y[idx])
            loss.backward()
            opt.step()
            steps += 1
            samples += b * w
        train_s += time.perf_counter() - t0
        entry = {"epoch": epoch + 1, "train_s": train_s, "train_loss": loss.item()}
        if not args.no_eval:
            model.eval()
            with torch.no_grad():
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
                    logits = torch.cat([model(tx[i:i + 1000]) for i in range(0, tx.shape[0], 1000)]).float()
            entry["test_accuracy"] = (logits.argmax(1) == ty).float().mean().item()
        history.append(entry)
        if args.max_steps and steps >= args.max_steps:
            break
    if rank == 0:
        out.put({"system": "pytorch-ddp-gloo", "world_size": w, "precision": args.precision, "model": args.model, "batch_size_per_worker": b,
                 "threads": args.threads, "steps": steps, "samples": samples, "train_s": train_s,
                 "samples_per_s": samples / train_s, "history": history,
                 "test_accuracy": history[-1].get("test_accuracy", -1)})
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--model", choices=["cnn", "mlp"], default="cnn")
    p.add_argument("--batch-size", type=int, default=64, help="per worker")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=0)
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--lr-decay", type=float, default=1.0)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--threads", type=int, default=1, help="per process")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                   help="bf16: forward and loss under CPU autocast in bfloat16 (float32 weights and optimizer)")
    p.add_argument("--no-eval", action="store_true")
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--json-out")
    args = p.parse_args()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [ctx.Process(target=worker, args=(r, args, port, out)) for r in range(args.world_size)]
    for pr in procs:
        pr.start()
    result = out.get(timeout=24 * 3600)
    for pr in procs:
        pr.join(60)
        if pr.exitcode != 0:
            sys.exit(f"ddp_train: a worker failed with exit code {pr.exitcode}")
    text = json.dumps(result, indent=2)
    print(text)
    if args.json_out:
        with open(args.json_out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
