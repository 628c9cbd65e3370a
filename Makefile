# `make demo`: set up (Debian packages, .venv, pillow-simd) and run the workflow on the bundled demo.
# `make test`: set up and run the test suite.
VENV ?= .venv
PY := $(VENV)/bin/python
SNAKEMAKE := $(VENV)/bin/snakemake
CORES ?= 2

.PHONY: setup demo demo-data test lint clean-demo

setup:
	bash tools/setup.sh

demo-data: setup
	@[ -f demo/data/manifest.tsv ] || $(PY) -m shardsmith.demo demo/data

demo: demo-data
	$(SNAKEMAKE) --workflow-profile none --cores $(CORES)
	@$(PY) -m shardsmith.summary demo/fast-storage/demo/$$(cat demo/fast-storage/demo/latest)

test: setup
	$(PY) -m pytest

lint: setup
	$(SNAKEMAKE) --lint --workflow-profile none
	$(VENV)/bin/snakefmt --check Snakefile rules/

clean-demo:
	rm -rf demo/cache demo/work demo/results demo/fast-storage demo/logs
