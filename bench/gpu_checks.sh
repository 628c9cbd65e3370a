#!/usr/bin/env bash
# The GPU checks in one run on a GPU node (about 9 minutes on an H200), each stage under its own time limit
# so that a slow one cannot lose the others' figures: bench/embed_bench.py for ViT-B-32 over the decode paths
# (with the resize shared by the GPU and the workers: gpu@0,RESIZE; gpu@0+graph: the model's pass as a CUDA
# graph, embed.cuda_graph), the figure the GPU issue waits on; then
# the embedding tests (their CUDA variants run where a GPU is; test_stats needs faiss, which GPU nodes lack);
# then ViT-L-14; then bench/heads_bench.py (the score heads' cost beside ViT-B-32, the cheapest pass and so the
# heads' largest share). Python packages the node lacks (open_clip_torch, ftfy, wcwidth) come from wheels in
# .whl/ when that folder is there: made in the checkout's root (listed in .git/info/exclude, so that git
# leaves it out, and carried to the node) with
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl \
#     open_clip_torch==3.3.0 ftfy==6.3.1 wcwidth==0.9.4
#
#   OUT=/some/folder bash bench/gpu_checks.sh     # logs and results land in $OUT (default bench/results/gpu)
#   MODELS= bash bench/gpu_checks.sh              # the tests alone
#   TESTS_K="cuda or nvjpeg" B32_DECODE="cpu gpu@0" HEADS_S=0 bash bench/gpu_checks.sh   # a shorter run
# The parts repeat 8,192 images up to 32,768 samples (ViT-B-32) and 16,384 (ViT-L-14): past the batches the
# workers have ready when the model has loaded (two a worker), enough remain for the steady rate
# (steady_img_per_s), the rate of a 250,000-sample part.
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
nproc >>"$OUT/gpu.txt"
bench() {  # model, seconds, then embed_bench's own arguments
    local model=$1 limit=$2 start
    shift 2
    start=$(date +%s)
    timeout "$limit" python3 bench/embed_bench.py --models "$model" --data /tmp/embed-bench \
        --out "$OUT/embed-$model.json" "$@" >"$OUT/bench-$model.log" 2>&1
    echo "$model: exit $? in $(($(date +%s) - start)) s"
    tail -3 "$OUT/bench-$model.log"
}
case " ${MODELS-ViT-B-32 ViT-L-14} " in *" ViT-B-32 "*)
    # shellcheck disable=SC2086  # the paths are words
    bench ViT-B-32 "${B32_S:-200}" --count 32768 --unique 8192 --batch 512 --workers 15 \
        --decode ${B32_DECODE:-cpu gpu@0 gpu@0+graph gpu@1 gpu@0,0.85} ;;
esac
start=$(date +%s)
timeout "${TESTS_S:-130}" python3 -m pytest -q -p no:cacheprovider -rs ${TESTS_K:+-k "$TESTS_K"} \
    tests/embed/test_decode.py tests/embed/test_part.py tests/embed/test_model.py tests/embed/test_heads.py \
    tests/test_embed_bench.py >"$OUT/tests.log" 2>&1
echo "tests: exit $? in $(($(date +%s) - start)) s" | tee -a "$OUT/tests.log"
tail -4 "$OUT/tests.log"
case " ${MODELS-ViT-B-32 ViT-L-14} " in *" ViT-L-14 "*)
    bench ViT-L-14 "${L14_S:-150}" --count 16384 --unique 8192 --batch 256 --workers 7 15 --decode cpu gpu@0 ;;
esac
[ "${HEADS_S:-70}" = 0 ] && exit 0
start=$(date +%s)
timeout "${HEADS_S:-70}" python3 bench/heads_bench.py --device cuda --models ViT-B-32 --batch 512 --count 4096 \
    --rounds 3 --data /tmp/embed-bench --out "$OUT/heads.json" >"$OUT/heads.log" 2>&1
echo "heads: exit $? in $(($(date +%s) - start)) s"
tail -2 "$OUT/heads.log"
