#!/bin/sh
# One node, three processes: rank 0 drives, ranks 1 and 2 train (PyTorch 2.x's torchrun).
export DSGD_TOKEN=${DSGD_TOKEN:-s3cret}
exec torchrun --nnodes 1 --nproc-per-node 3 --no-python \
  build/dsgd train --model cnn --epochs 3 --batch-size 128 --lr 0.04 --momentum 0.9 --threads 1
