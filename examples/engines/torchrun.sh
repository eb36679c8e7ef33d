#!/bin/sh
# One node, three processes: rank 0 drives, ranks 1 and 2 train. Underscored flags and
# --redirects/--tee 2 for Debian 12's torchrun (PyTorch 1.13, Python 3.11: README.md); 2.x takes them too.
export DSGD_TOKEN=${DSGD_TOKEN:-s3cret}
exec torchrun --standalone --nnodes 1 --nproc_per_node 3 --redirects 2 --tee 2 --no_python \
  build/dsgd train --model cnn --epochs 3 --batch-size 128 --lr 0.04 --momentum 0.9 --threads 1
