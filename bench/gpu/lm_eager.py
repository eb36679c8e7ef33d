#!/usr/bin/env python3
"""PyTorch eager training the GPT of `dsgd_gpu_bench --model gpt-*` on one GPU: the same model
(bench/peers/ddp_gpt.py's, which is src/models/gpt.cpp's), AdamW (betas 0.9/0.95, decay on
matrices), random tokens already on the device, warm-up steps, then the wall time of --steps steps,
each ending with the loss read back (as dsgd's train_batch does). Prints one JSON line.

  bench/gpu/lm_eager.py --model gpt-base --batch 16 --precision bf16 --attention sdpa
  bench/gpu/lm_eager.py --write-tokens /tmp/rand.tok --vocab 50257 --count 4000000   # dsgd's input

--attention math is the model as written (scores, mask, softmax, as dsgd's GPT on LibTorch 1.13);
sdpa is torch.nn.functional.scaled_dot_product_attention (is_causal), as dsgd's GPT on LibTorch 2.
"""
import argparse, json, math, os, struct, sys, time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "peers"))
import ddp_gpt  # noqa: E402


def sdpa_block(self, x, mask):
    n, t, d = x.shape
    q, k, v = self.qkv(self.ln1(x)).view(n, t, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    x = x + self.proj(y.transpose(1, 2).reshape(n, t, d))
    return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


def write_tokens(path, vocab, count, seed):
    g = torch.Generator().manual_seed(seed)
    width = 2 if vocab <= 65536 else 4
    tokens = torch.randint(0, vocab, (count,), generator=g, dtype=torch.int32)
    data = tokens.numpy().astype("<u2" if width == 2 else "<u4").tobytes()
    with open(path, "wb") as f:
        f.write(b"DSGDTOK1" + struct.pack("<IIQQ", width, 0, vocab, count) + data)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(ddp_gpt.SIZES), default="gpt-small")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    p.add_argument("--attention", choices=["math", "sdpa"], default="sdpa")
    p.add_argument("--batch", type=int, default=32, help="sequences a step")
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--device", default="cuda")
    p.add_argument("--write-tokens", help="write COUNT random tokens of VOCAB to this token file and stop")
    p.add_argument("--count", type=int, default=4_000_000)
    args = p.parse_args()
    if args.write_tokens:
        write_tokens(args.write_tokens, args.vocab, args.count, 1)
        return
    torch.manual_seed(1)
    dev = torch.device(args.device)
    layers, d, heads, context = ddp_gpt.SIZES[args.model]
    if args.attention == "sdpa":
        ddp_gpt.Block.forward = sdpa_block
    model = ddp_gpt.Gpt(args.vocab, layers, d, heads, context).to(dev)
    model.mask = model.mask.to(dev)
    decay = [q for q in model.parameters() if q.dim() >= 2]
    rest = [q for q in model.parameters() if q.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    data = torch.randint(0, args.vocab, (args.batch * 8, context + 1), device=dev)

    def step(i):
        window = data[(i % 8) * args.batch:][:args.batch]
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            logits = model(window[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), window[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        return loss.item()

    for i in range(args.warmup):
        step(i)
    t0 = time.perf_counter()
    for i in range(args.steps):
        loss = step(i)
    s = time.perf_counter() - t0
    print(json.dumps({"impl": "eager", "attention": args.attention, "model": args.model, "precision": args.precision,
                      "batch": args.batch, "context": context, "steps": args.steps, "seconds": s, "loss": loss,
                      "tokens_per_s": args.steps * args.batch * context / s,
                      "peak_mem_mb": torch.cuda.max_memory_allocated() / 2**20 if dev.type == "cuda" else None}))


if __name__ == "__main__":
    main()
