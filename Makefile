# dsgd — the two commands of the quick start, and a few more for developers.
#   make demo        install what is missing, build, train the CNN on Fashion-MNIST
#   make test        install what is missing, build, run the fast test suite, then the long one
# Also: make build | test-fast | test-long | test-cluster | bench | bench-comm | bench-cluster | bench-scale
#       | fuzz | clean
BUILD ?= build
JOBS  ?= $(shell nproc)
CTEST  = ctest --test-dir $(BUILD) --output-on-failure --timeout 900
# ccache: hit across checkouts in different directories (CI clones somewhere new each time).
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := 1

.PHONY: deps demo-deps configure build demo test test-fast test-long test-cluster bench bench-comm bench-cluster \
	bench-scale fuzz clean
deps:
	@scripts/install-deps.sh

# The demo's packages only: no fuzzing toolchain, no benchmark peers (PyTorch, OpenMPI).
demo-deps:
	@scripts/install-deps.sh --demo

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo

configure: deps $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# The main job: the reference CNN on Fashion-MNIST, 3 epochs of global batch 128 (90.9% test
# accuracy; 89.96% after the second), 2 worker processes averaging gradients by allreduce (1 thread
# each: 2 cores). Builds only the dsgd binary. Prints progress and a JSON summary, saves a
# checkpoint (with model.pt for Python) in $(BUILD)/demo-ckpt.
demo: demo-deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS) --target dsgd
	$(BUILD)/dsgd train --workers 2 --strategy allreduce --model cnn --epochs 3 --batch-size 128 --lr 0.04 \
	    --lr-decay 0.5 --momentum 0.9 --threads 1 --save $(BUILD)/demo-ckpt --json-out $(BUILD)/demo.json

test: test-fast test-long

# Each suite ends by checking that no test left a shared-memory segment in /dev/shm.
test-fast: build
	$(CTEST) -j $(JOBS) -LE long
	tests/no_shm_left.sh

test-long: build
	$(CTEST) -L long
	tests/no_shm_left.sh

# A real Slurm on this machine (munged, slurmctld, 3 slurmd in network namespaces; root): submits
# examples/slurm/train.sbatch, kills a worker, checks Slurm's replacement (~2 min). Also in test-long.
test-cluster: build
	tests/runtime/slurm_cluster_test.sh $(BUILD)/dsgd

# Every benchmark in ~32 min, writing docs/BENCHMARKS.md: peers (PyTorch DDP, plain LibTorch),
# allreduce on one host, the simulated cluster reduced, and recovery (bench/all.sh).
bench: build
	bench/all.sh

bench-comm: build
	WRITE_DOCS=1 bench/allreduce.sh

# The simulated cluster: 2, 4 and 8 hosts in network namespaces on shaped links (~20 min, root).
bench-cluster: build
	WRITE_DOCS=1 LINK_BUSY=1 bench/cluster.sh

# 8 to 128 workers of the simulated model on this machine: the figures docs/SCALE.md fits (~10 min).
bench-scale: build
	bench/scale.sh

# The parsers' fuzz targets for FUZZ_SECONDS each (libFuzzer; what they find stays in $(BUILD)/fuzz).
FUZZ_SECONDS ?= 300
fuzz: deps
	tests/fuzz/run.sh $(FUZZ_SECONDS) $(BUILD)

clean:
	rm -rf $(BUILD)
