#!/usr/bin/env bash
# dev/gpu_check.sh: the first run on a GPU machine, in ONE call of at most BUDGET seconds (default 480).
# Stages run in priority order, each under its own cap (dev/gpu_stage.sh), so a hang or a failure costs
# only its cap and the later stages still run; after every stage $OUT/summary.md (a markdown table) is
# rewritten and every log goes into ONE archive, $OUT/gpu_check_logs.tar.gz:
#   env         nvidia-smi -q (clocks, power, MIG, ECC), driver, nvcc, kernel, CPU
#   binaries    the ones `make gpu_binaries` built beforehand on a CPU machine (build/gpu/: sm_90, host code
#               for x86-64-v3), installed if they are of these sources and start; else built here
#   harnesses   each kernel against its CPU twin (attention first, then matmul, loss, elementwise, optim),
#               with XSA_CUDA_SYNC=1: a synchronisation after every launch, so a fault names its kernel
#   sanitizers  compute-sanitizer memcheck, racecheck, synccheck on the attention harness (small shapes)
#   test_xsa    the CUDA suite: PyTorch references, identities, graphs, the CUDA trainer against the CPU one
#   model_twin  the CUDA backend against the CPU backend on one d4-size model and batch: loss, logits, every gradient
#   train       the trainer end to end (d4-size, learnable XSA) on the embedded data; SFT of such a model on
#               the mini conversations, with ChatCORE on the mini bundle at its end
#   bench       d24 and d12 at T 2048, XSA off and on (fused, unfused), the phases of a d24 XSA micro-step
# With the device tool, carry the prebuilt binaries (make gpu_binaries, then carry ["build/gpu"]) and run
#   bash dev/gpu_check.sh        (OUT is set by the tool; elsewhere OUT=/tmp/gpu_check)
# Knobs: BUDGET, ITERS (benchmark iterations, 10), D12_BATCH / D24_BATCH (32), GPU_CHECK_BIN (build/gpu).
# The CPU emulator's dry run of this script (dev/cuda/emu/run.sh gpu_check) sets GPU_CHECK_NO_GPU_OK=1 (go on
# without nvidia-smi), GPU_CHECK_SKIP_BUILD=1 (the binaries are in place) and GPU_CHECK_TINY=1 (tiny models
# for the training and benchmark stages).
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-/tmp/gpu_check}
GPU_STAGE_TITLE="gpu_check at commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- 2>/dev/null || echo ' (+ working tree changes)')"
source dev/gpu_stage.sh
ITERS=${ITERS:-10}
D12_BATCH=${D12_BATCH:-32}
D24_BATCH=${D24_BATCH:-32}  # train_gpt's default -b at d24 on an H100/H200 (the largest that fits, up to 32)
BIN=${GPU_CHECK_BIN:-build/gpu}
JOBS=$(nproc 2>/dev/null || echo 2)
BENCH_TABLE=$LOGS/bench_table.md
GPU_STAGE_EXTRA=$BENCH_TABLE

# ---- env: what the numbers below were measured on
env_report() {
    nvidia-smi -q
    nvidia-smi
    nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total,clocks.max.sm,clocks.max.mem,power.limit,mig.mode.current,ecc.mode.current --format=csv
    command -v nvcc >/dev/null && nvcc --version
    uname -a
    grep -m1 "model name" /proc/cpuinfo
    echo "cpu flags for x86-64-v3: $(grep -m1 -o -w -e avx2 -e bmi2 -e fma -e movbe /proc/cpuinfo | sort -u | tr '\n' ' ')"
    echo "$(nproc) CPUs; driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1); $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' || echo 'no nvcc')"
}
stage env 30 bash -c "$(declare -f env_report); env_report"
gpu=$(nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total,clocks.max.sm,power.limit,mig.mode.current,ecc.mode.current --format=csv,noheader 2>/dev/null | head -n 1)
note device "${gpu:-no GPU: nvidia-smi found none}"
if [ -z "$gpu" ] && [ -z "${GPU_CHECK_NO_GPU_OK:-}" ]; then
    note "GPU stages" "SKIPPED: no GPU on this machine"
    exit 0
fi

# ---- binaries: prebuilt if they are of these sources and start, else built here
sources_hash() { sh dev/gpu_sources_hash.sh; }
install_prebuilt() {
    [ -f "$BIN/SOURCES" ] || { echo "no prebuilt binaries in $BIN (make gpu_binaries builds them)"; return 1; }
    [ "$(cat "$BIN/SOURCES")" = "$(sources_hash)" ] || { echo "$BIN was built from other sources ($(cat "$BIN/SOURCES") != $(sources_hash))"; return 1; }
    local b
    for b in "$BIN"/*; do
        [ -x "$b" ] || continue
        if ldd "$b" | grep "not found"; then echo "$b cannot start: a library is missing"; return 1; fi
    done
    "$BIN/train_gpt_cuda" --help > /dev/null || { echo "$BIN/train_gpt_cuda does not start (exit $?)"; return 1; }
    mkdir -p dev/cuda/bin dev/bench
    cp "$BIN"/train_gpt_cuda "$BIN"/test_xsa_cuda "$BIN"/sample_cuda "$BIN"/chat_sft_cuda "$BIN"/train_gpt_cpu "$BIN"/test_xsa_cpu .
    cp "$BIN"/bench_fwdbwd_cuda dev/bench/
    cp "$BIN"/*_check dev/cuda/bin/
    touch train_gpt_cuda test_xsa_cuda sample_cuda chat_sft_cuda train_gpt_cpu test_xsa_cpu dev/bench/bench_fwdbwd_cuda dev/cuda/bin/*  # newer than the sources: make keeps them
    echo "installed the prebuilt binaries of $BIN (sources $(cat "$BIN/SOURCES"))"
}
if [ -n "${GPU_CHECK_SKIP_BUILD:-}" ]; then
    note binaries "SKIPPED: GPU_CHECK_SKIP_BUILD (the binaries are in place)"
elif ! stage binaries_prebuilt 30 bash -c "BIN=$BIN; $(declare -f sources_hash install_prebuilt); install_prebuilt"; then
    stage build 300 make -j"$JOBS" cuda_targets sample chat_sft train_gpt_cpu test_xsa_cpu && cp sample sample_cuda && cp chat_sft chat_sft_cuda
fi

# ---- correctness, each kernel naming itself on a fault
for h in attention matmul loss elementwise optim; do
    case $h in
        attention) args="--no-timing --quiet"; cap=120 ;;
        elementwise) args="--reps 1 --time 0"; cap=45 ;;
        optim) args="1"; cap=60 ;;
        *) args="1"; cap=45 ;;  # loss, matmul: 1 timed repeat
    esac
    stage "harness_$h" $cap env XSA_CUDA_SYNC=1 dev/cuda/bin/${h}_check $args
done
if command -v compute-sanitizer >/dev/null; then
    for tool in memcheck racecheck synccheck; do
        stage "sanitizer_$tool" 75 compute-sanitizer --tool $tool --error-exitcode 1 dev/cuda/bin/attention_check --no-timing --quiet --small
    done
else
    note sanitizers "SKIPPED: compute-sanitizer not found"
fi
stage test_xsa_cuda 180 ./test_xsa_cuda
TWIN=$(mktemp -d)/twin.safetensors  # 57 MB: not in the archive
stage model_twin 90 bash -c "./test_xsa_cpu --twin-write $TWIN && XSA_CUDA_SYNC=1 ./test_xsa_cuda --twin-check $TWIN"
TRAIN="-d 4 -t 256 -b 4 -B 4096 -n 4 --eval-every 4 --eval-tokens 8192 --sample-every -1 --core-every -1 -x learn"
[ -n "${GPU_CHECK_TINY:-}" ] && TRAIN="-d 1 --dim 64 --heads 1 -t 64 -b 2 -B 256 -n 2 --eval-every 2 --eval-tokens 512 --sample-every -1 --core-every -1 -x learn"
stage train_d4_learn 60 env XSA_CUDA_SYNC=1 ./train_gpt_cuda $TRAIN
# SFT on the CUDA backend (the loss's ignored targets and its device-side mean, the packing's padding), then
# ChatCORE at its end on the embedded bundle (batched categorical forwards, greedy generation with the
# calculator tool, HumanEval's python3 test processes): both must run through; a base of the same shape first
SFT=$(mktemp -d)
stage sft_chatcore 90 bash -c "./train_gpt_cuda $TRAIN -o $SFT/base > /dev/null &&
        XSA_CUDA_SYNC=1 ./chat_sft_cuda --sft dev/data/sft_mini_tokens --init-from \$(ls $SFT/base/ckpt_*.safetensors | tail -n 1) -n 3 \
        --eval-every 3 --eval-tokens 4096 --chatcore-max-cat 8 --chatcore-max-sample 2 -o $SFT/sft &&
        grep -q '\"kind\": \"chatcore\"' $SFT/sft/metrics.jsonl"
rm -rf "$SFT"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c GPU)
if [ "$gpus" -ge 2 ]; then
    stage train_ranks2 60 ./train_gpt_cuda $TRAIN --ranks 2
fi

# ---- benchmarks: bench_fwdbwd_cuda LAYERS DIM HEADS KV HEAD_DIM T VOCAB BATCH PATTERN SHORT ALPHA ITERS FUSED [GRAPHS [PHASES]]
bench() {  # name cap, then bench_fwdbwd_cuda's arguments
    local name=$1 cap=$2
    shift 2
    if stage "bench_$name" "$cap" dev/bench/bench_fwdbwd_cuda "$@"; then
        local log=$LOGS/bench_$name.log
        echo "| $name | $(sed -n 's/^step tok\/s \([0-9.]*\).*/\1/p' "$log") | $(sed -n 's/.* MFU \([0-9.]*%\).*/\1/p' "$log") | $(sed -n 's/^device memory in use GiB \([0-9.]*\)/\1/p' "$log") | $(sed -n 's/^ours tok\/s [0-9.]* ms\/iter \([0-9.]*\)/\1/p' "$log") | $(sed -n 's/^optimizer step ms \([0-9.]*\)/\1/p' "$log") | $(sed -n 's/^cuBLASLt: \([0-9]*\) GEMM shapes tuned (\([0-9.]*\) ms with .*, \([0-9.]*\) ms as chosen).*/\2 -> \3 (\1 shapes)/p' "$log") |" >> "$BENCH_TABLE"
        gpu_stage_flush
    fi
}
D24="24 1024 16 16 64 2048 32768 $D24_BATCH SSSL 512"
D12="12 768 12 12 64 2048 32768 $D12_BATCH SSSL 512"
if [ -n "${GPU_CHECK_TINY:-}" ]; then
    D24="2 128 2 2 64 128 512 2 SSSL 64"
    D12="1 64 1 1 64 64 512 2 SSSL 32"
    ITERS=2
fi
{ echo "benchmark (bench_fwdbwd_cuda; d24 = $D24, d12 = $D12: layers dim heads kv head_dim T vocab rows pattern short window):"
  echo "a training step as train_gpt runs it (micro-steps of the rows x T, then the optimizer), medians over $ITERS iterations"
  echo
  echo "| config | tok/s | MFU | mem GiB | micro-step ms | optimizer ms | GEMMs once each, ms: cuBLASLt heuristic's first -> tuned |"
  echo "|---|---|---|---|---|---|---|"; } > "$BENCH_TABLE"
bench d24_base 90 $D24 0 "$ITERS" 1
bench d24_xsa_fused 90 $D24 1 "$ITERS" 1
bench d12_base 60 $D12 0 "$ITERS" 1
bench d12_xsa_fused 60 $D12 1 "$ITERS" 1
bench d24_xsa_unfused 90 $D24 1 "$ITERS" 0
if stage phases_d24_xsa 90 dev/bench/bench_fwdbwd_cuda $D24 1 5 1 1 1; then
    { echo; echo "phases of a d24 XSA micro-step ($D24_BATCH x 2048, eager launches):"; echo; echo '```'
      sed -n '/^phases of a micro-step/,$p' "$LOGS/phases_d24_xsa.log"; echo '```'; } >> "$BENCH_TABLE"
fi
# generation (sample, KV cache): a d12 model after one step on the embedded corpus, greedy from the first
# 4000 bytes of dev/data/devil/README.md (885 tokens), 256 new tokens
GEN=$(mktemp -d)  # the 1.1 GB model: not in the archive
GEN_TRAIN="-d 12 -b 1 -B 2048 -n 1 --eval-every 1 --eval-tokens 2048 --sample-every -1 --core-every -1"
GEN_BYTES=4000
if [ -n "${GPU_CHECK_TINY:-}" ]; then
    GEN_TRAIN="-d 1 --dim 64 --heads 1 -t 64 -b 1 -B 64 -n 1 --eval-every 1 --eval-tokens 64 --sample-every -1 --core-every -1"
    GEN_BYTES=40
fi
if [ -x ./sample_cuda ] && stage generate_d12 90 bash -c "./train_gpt_cuda $GEN_TRAIN --export-safetensors $GEN/model.safetensors > /dev/null &&
        head -c $GEN_BYTES dev/data/devil/README.md | ./sample_cuda -e $GEN/model.safetensors -t 0 -n 256 > /dev/null"; then
    { echo; echo "generation (sample_cuda, d12 after one step, greedy, batch 1, the first $GEN_BYTES bytes of dev/data/devil/README.md as the prompt):"; echo
      grep "new tokens" "$LOGS/generate_d12.log"; } >> "$BENCH_TABLE"
fi
rm -rf "$GEN"
for h in attention matmul; do  # the kernels' own timings at the real shapes (no XSA_CUDA_SYNC)
    case $h in attention) args="";; *) args="5";; esac
    [ -n "${GPU_CHECK_TINY:-}" ] && args="${args/5/1}"
    stage "timing_$h" 90 dev/cuda/bin/${h}_check $args
done
gpu_stage_flush
cat "$OUT/summary.md"
