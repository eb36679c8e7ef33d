"""Models defined in Python and saved as TorchScript, for dsgd's tests and benchmarks.

    python3 scripted_models.py cnn OUT.pt [--no-dropout] [--trace] [--classes N]
    python3 scripted_models.py bn-cnn OUT.pt [--trace] [--classes N]

cnn:    the reference CNN (dsgd/models/registry.h: pytorch/examples' MNIST network), layer for layer and
        under the same parameter names as dsgd's C++ one (conv1, conv2, fc1, fc2).
bn-cnn: a small CNN with BatchNorm and Dropout (buffers, and a train/eval difference).
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class Cnn(nn.Module):
    def __init__(self, dropout: bool = True, in_channels: int = 1, image_size: int = 28, classes: int = 10):
        super().__init__()
        side = (image_size - 4) // 2
        self.conv1 = nn.Conv2d(in_channels, 32, 3)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.dropout1 = nn.Dropout(0.25 if dropout else 0.0)
        self.fc1 = nn.Linear(64 * side * side, 128)
        self.dropout2 = nn.Dropout(0.5 if dropout else 0.0)
        self.fc2 = nn.Linear(128, classes)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = self.dropout1(F.max_pool2d(x, 2))
        x = self.dropout2(F.relu(self.fc1(torch.flatten(x, 1))))
        return self.fc2(x)


class BnCnn(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(0.3), nn.Linear(32 * 7 * 7, classes))

    def forward(self, x):
        return self.head(self.features(x))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", choices=["cnn", "bn-cnn"])
    parser.add_argument("out")
    parser.add_argument("--no-dropout", action="store_true")
    parser.add_argument("--trace", action="store_true", help="torch.jit.trace instead of torch.jit.script")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--classes", type=int, default=10)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    net = Cnn(dropout=not args.no_dropout, classes=args.classes) if args.model == "cnn" else BnCnn(args.classes)
    scripted = torch.jit.trace(net, torch.zeros(2, 1, 28, 28)) if args.trace else torch.jit.script(net)
    torch.jit.save(scripted, args.out)


if __name__ == "__main__":
    main()


class TinyLm(nn.Module):
    """A causal transformer language model in plain PyTorch: tokens [N, T] -> logits [N, T, vocab]."""

    def __init__(self, vocab=256, context=32, dim=64, heads=4, layers=2):
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(context, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)
        self.register_buffer("causal", torch.triu(torch.full((context, context), float("-inf")), 1))

    def forward(self, tokens):
        t = tokens.size(1)
        x = self.tokens(tokens) + self.positions(torch.arange(t, device=tokens.device))
        return self.head(self.norm(self.blocks(x, mask=self.causal[:t, :t])))
