"""PyTorch eager's training throughput, measured as bench/gpu/throughput.cpp measures dsgd's:
torchvision's model of the same layout, synthetic data already on the GPU, each step's batch
gathered by a random index, SGD with momentum (PyTorch's default multi-tensor form), the loss
and accuracy read back every step (as dsgd's default train_batch does; `--sync end`: only after
the last step, as a loop that never waits for the GPU), cuDNN benchmarking on unless told
otherwise (as dsgd's image classifier), warm-up steps, then the wall time of
--steps steps. Prints one JSON line."""
import argparse, json, time

import torch
import torchvision

p = argparse.ArgumentParser()
p.add_argument("--model", default="resnet50")
p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
p.add_argument("--batch", type=int, default=128)
p.add_argument("--image-size", type=int, default=224)
p.add_argument("--channels", type=int, default=3)
p.add_argument("--samples", type=int, default=1024)
p.add_argument("--warmup", type=int, default=10)
p.add_argument("--steps", type=int, default=40)
p.add_argument("--cudnn-benchmark", type=int, default=1, choices=[0, 1], help="torch.backends.cudnn.benchmark")
p.add_argument("--channels-last", type=int, default=0, choices=[0, 1], help="weights and inputs in channels_last")
p.add_argument("--sync", default="step", choices=["step", "end"], help="read loss and accuracy back every step, or at the end")
a = p.parse_args()

dev = torch.device("cuda")
torch.backends.cudnn.benchmark = bool(a.cudnn_benchmark)
fmt = torch.channels_last if a.channels_last else torch.contiguous_format
torch.manual_seed(1)
model = getattr(torchvision.models, a.model)(num_classes=10)
if a.channels != 3:
    model.conv1 = torch.nn.Conv2d(a.channels, 64, 7, 2, 3, bias=False)
model = model.to(dev, memory_format=fmt).train()
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
data = torch.randn(a.samples, a.channels, a.image_size, a.image_size, device=dev).contiguous(memory_format=fmt)
labels = torch.randint(0, 10, (a.samples,), device=dev)
loss_fn = torch.nn.CrossEntropyLoss()


def step():
    idx = torch.randint(0, a.samples, (a.batch,), device=dev)
    x, y = data.index_select(0, idx), labels.index_select(0, idx)
    opt.zero_grad()
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
        out = model(x)
        loss = loss_fn(out, y)
    loss.backward()
    opt.step()
    correct = (out.argmax(1) == y).sum()
    if a.sync == "step":
        return loss.item(), correct.item()
    return loss.detach(), correct


for _ in range(a.warmup):
    step()
torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(a.steps):
    loss, _ = step()
torch.cuda.synchronize()
s = time.perf_counter() - t0
loss = float(loss)
print(json.dumps({"impl": "eager", "model": a.model, "precision": a.precision, "workers": 1, "batch": a.batch,
                  "steps": a.steps, "seconds": s, "img_per_s": a.steps * a.batch / s, "loss": loss, "sync": a.sync,
                  "cudnn_benchmark": a.cudnn_benchmark, "channels_last": a.channels_last,
                  "torch": torch.__version__}), flush=True)
