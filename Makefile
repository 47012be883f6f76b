# Every target creates the virtual environment it needs by itself.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-0.1

.PHONY: demo test bench bench-gpu clean

# the C sources too: setup.py builds the extensions and the FUSE daemons from them (an editable install)
$(STAMP): pyproject.toml setup.py $(wildcard src/clairvoyant/*.[ch] src/clairvoyant/*/*.[ch])
	sh scripts/install-sysdeps.sh
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch 2.14.1 with torchvision 0.29.1: the tests run pytorch/examples' ImageNet port and torchvision's
	# datasets and transforms for real, and PyPI's torchvision does not load beside the local CPU torch 2.13.0.
	# Both are pinned (they lie on this machine's disk; an unpinned torch downloads a newer CUDA build).
	$(PY) -m pip install -q torch==2.14.1 torchvision==0.29.1
	$(PY) -m pip install -q -e '.[test,plot]'
	touch $(STAMP)

# the peers of benchmarks/packed_peers.py and MLPerf Storage's DLIO (the bench extra in pyproject.toml says why these are --no-deps)
$(VENV)/.bench-installed: $(STAMP) pyproject.toml
	$(PY) -m pip install -q --no-deps litdata==0.2.76 mosaicml-streaming==0.13.0 dlio-benchmark==2.0.0
	$(PY) -m pip install -q -e '.[bench]' torch==2.14.1 torchvision==0.29.1
	touch $@

demo: $(STAMP)
	$(VENV)/bin/clairvoyant demo $(DEMO_ARGS)
	# the bounded cache: half the data set fits; hit rate per epoch vs. the offline optimum and LRU
	$(VENV)/bin/clairvoyant demo --local-capacity 50%

test: $(STAMP)
	# a hard ceiling, so that a hang can never eat CI's 90 minutes (per-test timeouts are in pyproject); the
	# suite took 922 s on 2026-11-29 and over 1,500 s on a slower 2-core machine of the same kind on 2026-12-07.
	# The slowest tests are listed at the end, so that a run that grows shows where.
	timeout -k 10 3000 $(PY) -m pytest --durations=20 $(PYTEST_ARGS)
	# again without the C helper, so that its pure-Python fallback keeps working
	CLAIRVOYANT_NO_CEXT=1 timeout -k 10 900 $(PY) -m pytest -q tests/cache/test_cache.py tests/load/test_loader.py tests/load/test_errors.py tests/plan/test_residency.py tests/plan/test_elastic.py tests/tune/test_guard.py tests/plan/test_rank_plan.py tests/plan/test_cluster_plan.py tests/mount/test_mount.py tests/stage/test_ranges.py tests/plan/test_sequence.py tests/stage/test_thread_stage.py tests/mount/cluster/test_mount_cluster.py tests/plan/test_unplanned.py

# on a lent GPU node (docs/benchmarks.md, "Feeding the GPU"): ResNet-50 bf16 through every door, under 5 minutes
bench-gpu: $(STAMP)
	$(PY) benchmarks/gpu_feed.py

bench: $(STAMP) $(VENV)/.bench-installed
	# the first epoch against the store's limit on every door (issue 39): Loader on a tree, on tar shards, the mount
	$(PY) benchmarks/first_epoch.py
	# MLPerf Storage's DLIO (unet3d, scaled): accelerator utilization reading the store, the mount, a local copy
	$(PY) benchmarks/dlio.py
	# torchvision's standard transforms on uint8, a batch at a time (issue 40), against the DataLoader
	$(PY) benchmarks/transform_path.py
	$(PY) benchmarks/transform_path.py --val
	# a reader's share per sample with the JPEG decoded on the device (decode_on="device", issue 40)
	$(PY) benchmarks/decode_split.py
	# what authenticating and encrypting the cluster's peers costs (issue 41)
	$(PY) benchmarks/peer_auth.py
	$(PY) benchmarks/staging_vs_dataloader.py $(BENCH_ARGS)
	$(PY) benchmarks/caching.py --throughput
	$(PY) benchmarks/balance.py
	$(PY) benchmarks/cluster.py
	$(PY) benchmarks/plan_scale.py
	$(PY) benchmarks/simulate_validation.py
	$(PY) benchmarks/kernel_path.py
	$(PY) benchmarks/packed_peers.py
	# clairvoyant mount (issue 12): 29 KB files, then ImageNet-sized ones (85 KB)
	$(PY) benchmarks/mount.py
	$(PY) benchmarks/mount.py --size 448 --images 1600 --out benchmarks/results/mount-448
	# clairvoyant mount under capacity pressure (issue 22): 4 nodes at 30%, with and without the sampler
	$(PY) benchmarks/mount_capacity.py
	$(PY) benchmarks/mount_capacity.py --no-sampler
	# one rank's memory at 1.28 M samples (issue 22); tar shards cold against warm (LitData beside it)
	$(PY) benchmarks/rank_memory.py
	$(PY) benchmarks/packed_peers.py --shards 24 --peers litdata
	# HDF5 (issue 24): a CosmoFlow-like data set, first and second epoch against h5py
	$(PY) benchmarks/hdf5_epochs.py
	# compressed staging (issue 24): the tier at 30%, compressed against as it is, the store at 400 and 200 MB/s
	$(PY) benchmarks/compressed_staging.py
	$(PY) benchmarks/compressed_staging.py --bandwidth 200e6
	# a dataset with no files (issue 30): FakeData through the Loader against the DataLoader
	$(PY) benchmarks/map_dataset.py
	# clairvoyant mount --cluster (issue 23): 4 nodes with samplers at 15% and 30% (the cluster plan), without at 30%
	$(PY) benchmarks/mount_capacity.py --cluster --capacity 15%
	$(PY) benchmarks/mount_capacity.py --cluster
	$(PY) benchmarks/mount_capacity.py --cluster --no-sampler

clean:
	rm -rf $(VENV) build src/*.egg-info
