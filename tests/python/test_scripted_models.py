"""A model defined in Python, trained by dsgd's C++ workers, comes back to Python.

Run by ctest (tests/CMakeLists.txt) as
    DSGD_BINARY=build/dsgd /usr/bin/python3 -m pytest tests/python
with Debian's python3-torch and python3-pytest (scripts/install-deps.sh).
"""
import gzip
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
import scripted_models  # noqa: E402

DSGD = os.environ.get("DSGD_BINARY", "build/dsgd")
FASHION_MNIST = "/usr/share/datasets/fashion-mnist"


def fashion_mnist_test_set():
    """The test images normalised as dsgd's loader does (src/data/datasets.cpp), and the labels."""
    with gzip.open(os.path.join(FASHION_MNIST, "t10k-images-idx3-ubyte.gz")) as f:
        images = np.frombuffer(f.read(), dtype=np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(os.path.join(FASHION_MNIST, "t10k-labels-idx1-ubyte.gz")) as f:
        labels = np.frombuffer(f.read(), dtype=np.uint8, offset=8)
    x = (torch.from_numpy(images.astype(np.float32)) / 255.0 - 0.2860) / 0.3530
    return x, torch.from_numpy(labels.astype(np.int64))


def train(tmp_path, model_file, *flags):
    summary = tmp_path / "summary.json"
    workers = [] if "--in-process" in flags else ["--workers", "2"]
    cmd = [DSGD, "train", "--model", str(model_file), *workers, "--batch-size", "128", "--json-out", str(summary),
           *flags]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(summary.read_text()), done


def test_a_batchnorm_dropout_model_saved_by_dsgd_reloads_with_the_accuracy_dsgd_reported(tmp_path):
    torch.manual_seed(3)
    net = torch.jit.script(scripted_models.BnCnn())
    torch.jit.save(net, str(tmp_path / "bn.pt"))
    summary, _ = train(tmp_path, tmp_path / "bn.pt", "--max-steps", "80", "--save", str(tmp_path / "ckpt"))
    back = torch.jit.load(str(tmp_path / "ckpt" / "model.pt"))
    assert back.state_dict()["features.1.running_mean"].abs().sum() > 0, "BatchNorm's statistics came back trained"
    back.eval()
    images, labels = fashion_mnist_test_set()
    with torch.no_grad():
        correct = sum(int((back(images[i:i + 1000]).argmax(1) == labels[i:i + 1000]).sum())
                      for i in range(0, len(labels), 1000))
    accuracy = correct / len(labels)
    print(f"dsgd reported {summary['test_accuracy']:.4f}; the model.pt it saved, in PyTorch: {accuracy:.4f}")
    assert summary["test_accuracy"] > 0.5, summary
    assert accuracy == pytest.approx(summary["test_accuracy"], abs=1e-4)


def test_a_file_that_is_not_a_model_is_refused_naming_it(tmp_path):
    bad = tmp_path / "notes.pt"
    bad.write_text("not a model")
    done = subprocess.run([DSGD, "train", "--model", str(bad), "--max-steps", "1"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode != 0
    assert f"model file '{bad}': torch.jit.load cannot read it" in done.stderr


def test_dsgd_train_takes_tensors_and_adamw_with_workers_and_in_one_process_alike(tmp_path):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1000, 20, generator=g)
    y = (x @ torch.randn(20, 4, generator=g)).argmax(1)
    torch.save({"train_x": x[:800], "train_y": y[:800], "test_x": x[800:], "test_y": y[800:]}, tmp_path / "rows.pt")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    torch.jit.save(torch.jit.script(net), str(tmp_path / "mlp.pt"))
    flags = ["--dataset", str(tmp_path / "rows.pt"), "--optimizer", "adamw", "--weight-decay", "0.05", "--lr", "0.01",
             "--epochs", "3", "--max-steps", "0"]
    workers, _ = train(tmp_path, tmp_path / "mlp.pt", *flags)
    alone, _ = train(tmp_path, tmp_path / "mlp.pt", *flags, "--in-process")
    assert workers["optimizer"] == "adamw" and workers["steps"] == 3 * 7  # 800 rows in batches of 128
    assert workers["test_accuracy"] > 0.8, workers
    assert alone["test_accuracy"] == pytest.approx(workers["test_accuracy"], abs=0.011), "the same training, within 2 rows"
