"""A CNN defined in Python, trained on Fashion-MNIST by dsgd's C++ workers (no Python in them).

    PYTHONPATH=build/python /usr/bin/python3 examples/python/fashion_mnist.py [--workers 2] [--epochs 3]
"""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import dsgd


class Net(nn.Module):  # pytorch/examples' MNIST network, dsgd's reference "cnn"
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.dropout1 = nn.Dropout(0.25)
        self.fc1 = nn.Linear(9216, 128)
        self.dropout2 = nn.Dropout(0.5)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = self.dropout1(F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2))
        return self.fc2(self.dropout2(F.relu(self.fc1(torch.flatten(x, 1)))))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(1)
    # make demo's recipe: SGD with momentum, the learning rate x 0.7 after each epoch
    with dsgd.Trainer(model=Net(), data="fashion-mnist", num_workers=args.workers, batch_size=64, lr=0.02,
                      momentum=0.9, lr_decay=0.7, threads_per_worker=1) as trainer:
        for epoch in range(1, args.epochs + 1):
            start = time.time()
            train = trainer.train()
            seconds = time.time() - start
            test = trainer.validate()
            print(f"epoch {epoch}: train loss {train['loss']:.4f}, test accuracy {100 * test['accuracy']:.2f}%, "
                  f"{train['num_samples'] / seconds:.0f} samples/s", flush=True)
        trainer.save("fashion-mnist-ckpt")  # fashion-mnist-ckpt/model.pt: torch.jit.load reads it
        net = trainer.get_model()
    print("trained:", type(net).__name__, sum(p.numel() for p in net.parameters()), "parameters")


if __name__ == "__main__":
    main()
