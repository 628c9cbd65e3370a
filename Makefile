# `make demo`: set up (Debian packages, .venv, pillow-simd) and run the workflow on the bundled demo.
# `make test`: set up and run the test suite.
VENV ?= .venv
PY := $(VENV)/bin/python
SNAKEMAKE := $(VENV)/bin/snakemake
CORES ?= 2
# the config of `make retry-failed` (e.g. make retry-failed CONFIG=my.yaml), and on SLURM its profile
# (make retry-failed CONFIG=my.yaml PROFILE=cluster): the refetch then runs as batch jobs, not here
CONFIG ?= config/demo.yaml
PROFILE ?=

.PHONY: setup demo demo-data demo-model test lint clean-demo retry-failed bench

setup:
	bash tools/setup.sh

demo-data: setup
	@[ -f demo/data/manifest.tsv ] || $(PY) -m shardsmith demo demo/data

demo-model: setup
	@[ -f demo/models/tiny-clip.pt ] || $(PY) -m shardsmith tiny-clip demo/models

demo: demo-data demo-model
	$(SNAKEMAKE) --workflow-profile none --cores $(CORES) --configfile config/demo.yaml
	@$(SNAKEMAKE) --workflow-profile none --cores 1 --configfile config/demo.yaml --quiet all --report demo/report.html && echo "report: demo/report.html"
	@$(PY) -m shardsmith summary demo/fast-storage/demo/$$(cat demo/fast-storage/demo/latest)

# Three workers, a test file each at a time (pytest-xdist), in the order tests/conftest.py gives: the SLURM
# test first (it mostly waits for status polls), then the end-to-end runs.
test: setup
	$(PY) -m pytest -n 3 --dist loadfile --no-loadscope-reorder

# Fetch again only the records whose download failed for a transient reason (docs/running.md: Retrying failed downloads).
retry-failed: setup
	$(PY) -m shardsmith retry-failed $(CONFIG)
	$(SNAKEMAKE) $(if $(PROFILE),--profile $(PROFILE),--workflow-profile none --cores $(CORES)) --configfile $(CONFIG)

# Speed against img2dataset (its own venv, created by bench/setup_img2dataset.sh) and the resize ceiling (bench/README.md).
bench: setup
	$(PY) bench/resize_bench.py
	$(PY) bench/e2e_bench.py --mix web-size
	$(PY) bench/e2e_bench.py --mix large
	$(PY) bench/shard_checks.py
	$(PY) bench/demo_overhead.py
	$(PY) bench/memory_scale.py
	$(PY) bench/near_bench.py
	$(PY) bench/blur_bench.py

lint: setup
	$(SNAKEMAKE) --lint --workflow-profile none --configfile config/demo.yaml
	$(VENV)/bin/snakefmt --check Snakefile rules/
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean-demo:
	rm -rf demo/cache demo/work demo/results demo/fast-storage demo/logs
