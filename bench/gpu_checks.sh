#!/usr/bin/env bash
# The GPU checks in one run on a GPU node: the embedding tests (their CUDA variants run where a GPU is), then
# bench/embed_bench.py for ViT-B-32 and ViT-L-14, one invocation each so that a slow second one cannot lose
# the first's figures. Python packages the node lacks come from wheels in .whl/ when that folder is there.
#
#   OUT=/some/folder bash bench/gpu_checks.sh     # logs and results land in $OUT (default bench/results/gpu)
#   MODELS= bash bench/gpu_checks.sh              # the tests alone
set -u
OUT=${OUT:-bench/results/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || exit 1
    export PYTHONPATH=/tmp/site
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/gpu.txt" 2>&1
start=$(date +%s)
timeout "${TESTS_S:-240}" python3 -m pytest -q -p no:cacheprovider -rs tests/embed tests/test_embed_bench.py \
    >"$OUT/tests.log" 2>&1
echo "tests: exit $? in $(($(date +%s) - start)) s" | tee -a "$OUT/tests.log"
tail -4 "$OUT/tests.log"
for model in ${MODELS-ViT-B-32 ViT-L-14}; do
    start=$(date +%s)
    timeout "${BENCH_S:-240}" python3 bench/embed_bench.py --models "$model" --data /tmp/embed-bench \
        --out "$OUT/embed-$model.json" >"$OUT/bench-$model.log" 2>&1
    echo "$model: exit $? in $(($(date +%s) - start)) s"
    tail -2 "$OUT/bench-$model.log"
done
