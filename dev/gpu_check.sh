#!/usr/bin/env bash
# dev/gpu_check.sh: the one script a GPU session runs, within 10 minutes on an H100/H200:
#   1. build every CUDA target (warnings are errors)
#   2. what `make test-all` runs on a GPU machine: the CUDA suite (test_xsa.cu built with nvcc: the PyTorch
#      references, identities, graphs, the CUDA trainer against the CPU one), then the CPU suite
#   3. the kernel harnesses: each CUDA op against its CPU twin on random inputs, with timings
#   4. compute-sanitizer memcheck on a tiny training run; a tiny run on 2 ranks (NCCL) if 2 GPUs are present
#   5. benchmark d12 (768/12 heads) and d24 (1024/16 heads), T 2048: XSA off, alpha 1 fused and unfused,
#      and the phases of a d24 XSA micro-step (where its time goes)
# and prints a table last: tokens/s, MFU (nanochat FLOPs, 989 TFLOP/s peak), memory, XSA overhead
# (and d12 without CUDA graphs, d24 with 16 rows, to show what graphs and rows buy).
# Logs go to $OUT (or /tmp/gpu_check). Without a GPU it builds what it can and says so.
#   bash dev/gpu_check.sh            (ITERS=20 D12_BATCH=32 D24_BATCH=32 to change the benchmark)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}
ITERS=${ITERS:-20}
D12_BATCH=${D12_BATCH:-32}
D24_BATCH=${D24_BATCH:-32}  # train_gpt's default -b at d24 on an H100/H200 (the largest that fits, up to 32)
JOBS=$(nproc 2>/dev/null || echo 2)
mkdir -p "$OUT"
results=()
record() { results+=("$(printf '%-34s %s' "$1" "$2")"); echo "== $1: $2"; }

# run NAME TIMEOUT COMMAND...: logs to $OUT/NAME.log, records PASS/FAIL with the last line
run() {
    local name=$1 limit=$2
    shift 2
    echo "== $name: $*"
    if timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; then
        record "$name" "PASS ($(tail -n 1 "$OUT/$name.log"))"
    else
        record "$name" "FAIL (exit $?; $OUT/$name.log: $(tail -n 1 "$OUT/$name.log"))"
    fi
}

commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
gpu=$(nvidia-smi --query-gpu=name,compute_cap,memory.total --format=csv,noheader 2>/dev/null | head -n 1)
echo "gpu_check at commit $commit on: ${gpu:-no GPU}"

run build 420 make -j"$JOBS" cuda_targets train_gpt_cpu test_xsa_cpu eval_core
if [ -z "$gpu" ]; then
    record "GPU checks" "SKIPPED: no GPU on this machine (the CUDA targets were compiled above)"
    printf '%s\n' "${results[@]}"
    exit 0
fi

run test_xsa_cuda 180 ./test_xsa_cuda
run test_xsa_cpu 180 ./test_xsa_cpu
for h in dev/cuda/bin/*_check; do run "$(basename "$h")" 120 "$h"; done
TINY="-d 2 --dim 128 --heads 2 -t 128 -b 4 -B 512 -n 3 --eval-every 3 --sample-every -1 --core-every -1 -x 1"
if command -v compute-sanitizer >/dev/null; then
    run memcheck 300 compute-sanitizer --tool memcheck --error-exitcode 1 ./train_gpt_cuda $TINY
    if grep -q "Device not supported" "$OUT/memcheck.log"; then  # gVisor machines: the sanitizer cannot attach
        results[${#results[@]}-1]="$(printf '%-34s %s' memcheck "SKIPPED: compute-sanitizer refused this device (Device not supported)")"
    fi
else
    record memcheck "SKIPPED: compute-sanitizer not found"
fi
run train_tiny 120 ./train_gpt_cuda $TINY
# data parallel (--ranks, NCCL) needs two GPUs: two ranks must match the same run on the CPU backend's ranks
gpus=$(nvidia-smi -L 2>/dev/null | grep -c GPU)
if [ "$gpus" -ge 2 ]; then
    run train_ranks2 120 ./train_gpt_cuda $TINY --ranks 2
    run train_ranks2_cpu 120 ./train_gpt_cpu $TINY --ranks 2
    record "ranks 2: step-3 val bpb CUDA | CPU" "$(grep -o 'step 3/3 | val bpb [0-9.]*' "$OUT/train_ranks2.log") | $(grep -o 'step 3/3 | val bpb [0-9.]*' "$OUT/train_ranks2_cpu.log")"
else
    record train_ranks2 "SKIPPED: --ranks 2 (NCCL) needs 2 GPUs, this machine has $gpus"
fi

# benchmark: bench_fwdbwd_cuda LAYERS DIM HEADS KV HEAD_DIM T VOCAB BATCH PATTERN SHORT ALPHA ITERS FUSED [GRAPHS]
table=()
bench() {  # name, then the arguments
    local name=$1
    shift
    if timeout 180 dev/bench/bench_fwdbwd_cuda "$@" > "$OUT/bench_$name.log" 2>&1; then
        local tok mfu mem micro opt
        tok=$(sed -n 's/^step tok\/s \([0-9.]*\).*/\1/p' "$OUT/bench_$name.log")
        mfu=$(sed -n 's/.* MFU \([0-9.]*%\).*/\1/p' "$OUT/bench_$name.log")
        mem=$(sed -n 's/^device memory in use GiB \([0-9.]*\)/\1/p' "$OUT/bench_$name.log")
        micro=$(sed -n 's/^ours tok\/s [0-9.]* ms\/iter \([0-9.]*\)/\1/p' "$OUT/bench_$name.log")
        opt=$(sed -n 's/^optimizer step ms \([0-9.]*\)/\1/p' "$OUT/bench_$name.log")
        table+=("$name $tok ${mfu:-n/a} $mem $micro $opt")
    else
        table+=("$name FAIL - - - -")
        echo "benchmark $name failed: $OUT/bench_$name.log"
    fi
}
for d in 12 24; do
    if [ $d = 12 ]; then shape="12 768 12 12 64"; batch=$D12_BATCH; else shape="24 1024 16 16 64"; batch=$D24_BATCH; fi
    bench "d${d}_base" $shape 2048 32768 "$batch" SSSL 512 0 "$ITERS" 1
    bench "d${d}_xsa_fused" $shape 2048 32768 "$batch" SSSL 512 1 "$ITERS" 1
    bench "d${d}_xsa_unfused" $shape 2048 32768 "$batch" SSSL 512 1 "$ITERS" 0
done
bench "d12_base_no_graphs" 12 768 12 12 64 2048 32768 "$D12_BATCH" SSSL 512 0 "$ITERS" 1 0  # what the CUDA graph saves
bench "d24_base_b16" 24 1024 16 16 64 2048 32768 16 SSSL 512 0 "$ITERS" 1  # half the rows: what the batch buys
# where a d24 XSA micro-step's time goes, by phase of the model (eager launches, CUDA events)
if timeout 180 dev/bench/bench_fwdbwd_cuda 24 1024 16 16 64 2048 32768 "$D24_BATCH" SSSL 512 1 5 1 1 1 > "$OUT/phases_d24_xsa.log" 2>&1; then
    phases=$(sed -n '/^phases of a micro-step/,$p' "$OUT/phases_d24_xsa.log")
else
    phases="phases of a d24 XSA micro-step: FAIL ($OUT/phases_d24_xsa.log)"
fi

# the summary, also written to $OUT/summary.md for dev/gpu_results.md
{
echo
echo "gpu_check $(date -u +%Y-%m-%d), commit $commit, $gpu"
echo
echo "checks:"
printf '%s\n' "${results[@]}"
echo
echo "benchmark: T 2048, vocab 32768, SSSL windows; a training step as train_gpt runs it (the plan's total"
echo "batch as micro-steps of BATCH x 2048, then the optimizer), from medians over $ITERS iterations:"
printf '%-20s %12s %8s %9s %13s %8s %10s\n' config "tok/s" MFU "mem GiB" "micro-step ms" "opt ms" "XSA cost"
base=""
for row in "${table[@]}"; do
    set -- $row
    case $1 in *_base) base=$2 ;; esac
    cost="-"
    if [ "$2" != FAIL ] && [ -n "$base" ] && [ "$base" != FAIL ] && [[ $1 == *_xsa_* ]]; then
        cost=$(awk -v b="$base" -v x="$2" 'BEGIN { printf "%+.2f%%", 100 * (b / x - 1) }')
    fi
    printf '%-20s %12s %8s %9s %13s %8s %10s\n' "$1" "$2" "$3" "$4" "$5" "$6" "$cost"
done
echo
echo "d24, XSA alpha 1 fused, $D24_BATCH x 2048:"
echo "$phases"
} | tee "$OUT/summary.md"
