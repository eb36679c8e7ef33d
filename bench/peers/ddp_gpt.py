#!/usr/bin/python3
"""PyTorch DDP (gloo backend) training the same GPT on the same token file as
`dsgd train --model gpt-*`: the peer that bench/lm_peers.sh measures dsgd against. Run with
Debian's /usr/bin/python3 (python3-torch). Prints a JSON summary shaped like dsgd train's.

  /usr/bin/python3 bench/peers/ddp_gpt.py --world-size 2 --model gpt-small --tokens gcide/train.tok \
      --batch-size 8 --max-steps 50

The model is src/models/gpt.cpp's (GPT-2's layout, tied output layer, tanh GELU, the same
initialisation); the optimizer dsgd.LanguageModel's (AdamW, decay on tensors of 2+ dimensions,
betas 0.9/0.95, linear warmup then cosine). --batch-size is sequences per worker; each worker reads
its share of each global batch of windows (sample i = tokens [i T, (i + 1) T]) from the token file,
memory-mapped. The windows come in dsgd's order (src/torch/replica/replica.cpp: epoch 1's permutation,
drawn by a generator seeded seed x 0x9E3779B97F4A7C15 + 1; global batch s its elements [s B, (s + 1) B),
rank r the r-th part), and the model is built in dsgd's order after torch.manual_seed(seed): given
the same seed both start from the same weights and read the same sequences, so their losses can
be compared step by step (the first epoch; later ones are not reshuffled here). tokens/s counts
the training loop after --skip-steps warm-up steps. With
--val-tokens, rank 0 then reports val_loss: the mean loss per token over the first --val-sequences
sequences of that file (0: all), 16 at a time, as dsgd.LanguageModel's validation computes it.
max_rss_mb is the largest peak resident memory of any rank.
"""
import argparse, json, math, os, resource, socket, struct, sys, time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

SIZES = {"gpt-tiny": (4, 128, 4, 128), "gpt-small": (6, 384, 6, 256), "gpt-base": (12, 768, 12, 1024)}


def token_file(path):
    with open(path, "rb") as f:
        head = f.read(32)
    if head[:8] != b"DSGDTOK1":
        sys.exit(f"ddp_gpt: {path} is not a token file (dsgd prepare-text writes them)")
    width, _, vocab, count = struct.unpack("<IIQQ", head[8:32])
    dtype = {1: np.uint8, 2: np.uint16, 4: np.uint32}[width]
    return np.memmap(path, dtype=dtype, mode="r", offset=32, shape=(count,)), vocab


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        # dsgd's order (ln1, attention's qkv and proj, ln2, fc, fc_proj): the same draws from the
        # generator in construction and in the re-initialisation that follows.
        self.ln1 = nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc, self.fc_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    blocked = False  # --attention blocked: src/models/gpt.cpp's formulation instead

    def forward(self, x, mask):
        n, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(n, t, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        y = self.blocked_attention(q, k, v, mask) if Block.blocked else self.attention(q, k, v, mask)
        x = x + self.proj(y.transpose(1, 2).reshape(n, t, d))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    def attention(self, q, k, v, mask):
        t = q.shape[2]
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
        return att.masked_fill(mask[:t, :t], float("-inf")).softmax(-1) @ v

    def blocked_attention(self, q, k, v, mask):
        """dsgd's: the scale and an additive causal mask inside baddbmm, a block of queries at a time."""
        n, h, t, hd = q.shape
        q, k, v = (z.reshape(n * h, t, hd) for z in (q, k, v))
        bias = torch.zeros(t, t).masked_fill(mask[:t, :t], float("-inf"))
        blocks = min(max(t // 64, 1), 8)
        ys = []
        for b in range(blocks):
            q0, q1 = b * t // blocks, (b + 1) * t // blocks
            att = torch.baddbmm(bias[q0:q1, :q1], q[:, q0:q1], k[:, :q1].transpose(1, 2), alpha=1 / math.sqrt(hd))
            ys.append(torch.bmm(att.softmax(-1), v[:, :q1]))
        return torch.cat(ys, 1).view(n, h, t, hd)


class Gpt(nn.Module):
    def __init__(self, vocab, layers, d, heads, context):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(context, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        # Not a buffer: DDP would broadcast it, and gloo broadcasts no bool tensors.
        self.mask = torch.ones(context, context, dtype=torch.bool).triu(1)
        for name, p in self.named_parameters():
            if "ln" in name:
                continue
            nn.init.zeros_(p) if p.dim() == 1 else nn.init.normal_(p, 0.0, 0.02)
        for b in self.blocks:
            for w in (b.proj.weight, b.fc_proj.weight):
                nn.init.normal_(w, 0.0, 0.02 / math.sqrt(2 * layers))

    def forward(self, tokens):
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))
        for b in self.blocks:
            x = b(x, self.mask)
        return F.linear(self.ln_f(x), self.wte.weight)


def dsgd_epoch_seed(seed, epoch):
    """The seed of dsgd's permutation of the training set in `epoch` (0-based)."""
    return (seed * 0x9E3779B97F4A7C15 + epoch + 1) % (1 << 64)


def lr_at(args, step):
    if step < args.warmup_steps:
        return args.lr * (step + 1) / args.warmup_steps
    if args.decay_steps == 0:
        return args.lr
    progress = min(1.0, (step - args.warmup_steps) / args.decay_steps)
    return args.min_lr + (args.lr - args.min_lr) * 0.5 * (1 + math.cos(math.pi * progress))


def worker(rank, args, port, out):
    torch.set_num_threads(args.threads)
    Block.blocked = args.attention == "blocked"
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=args.world_size)
    torch.manual_seed(args.seed)
    tokens, vocab = token_file(args.tokens)
    layers, d, heads, context = SIZES[args.model]
    t = args.context or context
    model = Gpt(vocab, layers, d, heads, max(context, t))
    ddp = nn.parallel.DistributedDataParallel(model)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay}, {"params": rest, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    samples = (len(tokens) - 1) // t
    b, w = args.batch_size, args.world_size
    order = torch.randperm(samples, generator=torch.Generator().manual_seed(dsgd_epoch_seed(args.seed, 0)))
    steps, timed_s, losses = 0, 0.0, []
    ddp.train()
    dist.barrier()
    while steps < args.max_steps:
        idx = order[((steps * w + rank) * b) % (samples - b):][:b]
        window = torch.from_numpy(np.stack([tokens[i * t:(i + 1) * t + 1].astype(np.int64) for i in idx.tolist()]))
        for g in opt.param_groups:
            g["lr"] = lr_at(args, steps)
        t0 = time.perf_counter()
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            logits = ddp(window[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), window[:, 1:].reshape(-1))
        loss.backward()
        if args.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        opt.step()
        losses.append(loss.item())
        if steps >= args.skip_steps:
            timed_s += time.perf_counter() - t0
        steps += 1
    timed = steps - args.skip_steps
    val_loss = validate(args, model, t) if rank == 0 and args.val_tokens else None
    rss = [None] * w
    dist.all_gather_object(rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    if rank == 0:
        result = {"system": "pytorch-ddp-gloo", "world_size": w, "precision": args.precision, "model": args.model,
                  "parameters": sum(p.numel() for p in model.parameters()), "context": t,
                  "batch_size_per_worker": b, "threads": args.threads, "steps": steps, "timed_steps": timed,
                  "train_s": timed_s, "tokens_per_s": timed * b * w * t / timed_s, "tokens": steps * b * w * t,
                  "train_loss": losses[-1], "max_rss_mb": max(rss)}
        if val_loss is not None:
            result["val_loss"] = val_loss
        out.put(result)
        out.close()
        out.join_thread()  # the result is in the pipe
    # Not destroy_process_group: a rank that reached it while the other still ran once spun there
    # for good (gloo); every collective is done, so each rank just ends.
    os._exit(0)


def validate(args, model, t):
    tokens, _ = token_file(args.val_tokens)
    n = (len(tokens) - 1) // t
    if args.val_sequences > 0:
        n = min(n, args.val_sequences)
    total, count = 0.0, 0
    model.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
        for s in range(0, n, 16):
            window = torch.from_numpy(np.stack([tokens[i * t:(i + 1) * t + 1].astype(np.int64)
                                                for i in range(s, min(n, s + 16))]))
            logits = model(window[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), window[:, 1:].reshape(-1))
            total += loss.item() * window.shape[0]
            count += window.shape[0]
    model.train()
    return total / count


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--model", choices=sorted(SIZES), default="gpt-small")
    p.add_argument("--tokens", required=True, help="a token file (dsgd prepare-text)")
    p.add_argument("--context", type=int, default=0, help="0 = the model's")
    p.add_argument("--val-tokens", help="a token file to report val_loss on after training")
    p.add_argument("--val-sequences", type=int, default=0, help="its first this many sequences (0: all)")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per worker")
    p.add_argument("--max-steps", type=int, default=50)
    p.add_argument("--skip-steps", type=int, default=5, help="warm-up steps left out of tokens/s")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--min-lr", type=float, default=6e-5)
    p.add_argument("--warmup-steps", type=int, default=0)
    p.add_argument("--decay-steps", type=int, default=0)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--max-grad-norm", type=float, default=0.0)
    p.add_argument("--threads", type=int, default=1, help="per process")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--attention", choices=["plain", "blocked"], default="plain",
                   help="plain: matmul, scale, masked_fill, softmax (nanoGPT's CPU path); blocked: dsgd's")
    p.add_argument("--json-out")
    args = p.parse_args()
    if args.max_steps <= args.skip_steps:
        sys.exit("ddp_gpt: --max-steps must exceed --skip-steps")
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [ctx.Process(target=worker, args=(r, args, port, out)) for r in range(args.world_size)]
    for pr in procs:
        pr.start()
    result = None
    while result is None:  # a worker that died (its error on stderr) ends the run instead of hanging it
        try:
            result = out.get(timeout=5)
        except Exception:
            if any(pr.exitcode not in (None, 0) for pr in procs):
                for pr in procs:
                    pr.kill()
                sys.exit("ddp_gpt: a worker failed (see its error above)")
    for pr in procs:
        pr.join(60)
        if pr.exitcode != 0:
            sys.exit(f"ddp_gpt: a worker failed with exit code {pr.exitcode}")
    text = json.dumps(result, indent=2)
    print(text)
    if args.json_out:
        with open(args.json_out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
