#!/usr/bin/env bash
# dev/gpu_check.sh: the first run on a GPU machine, in ONE call of at most BUDGET seconds (default 420).
# Stages run in priority order, each under its own cap (dev/gpu_stage.sh), so a hang or a failure costs
# only its cap and the later stages still run; after every stage $OUT/summary.md (a markdown table) is
# rewritten and every log goes into ONE archive, $OUT/gpu_check_logs.tar.gz. The order: first what settles
# correctness, then the d24 numbers, then the rest.
#   set-up      env: nvidia-smi -q (clocks, power, MIG, ECC), driver, nvcc, kernel, CPU (every nvidia-smi call
#               under a timeout, GPU_CHECK_SMI_TIMEOUT, 20 s);
#               libraries: libcublasLt.so.13, libnccl.so.2, libcuda.so.1 and whatever a binary cannot find,
#               looked for in the loader cache, the CUDA toolkit's lib64 and python3's nvidia-* packages (the
#               ones its PyTorch loads), LD_LIBRARY_PATH set to what was found, `ldd` of every binary logged,
#               a missing library named in one line (dev/gpu/find_libs.sh);
#               binaries: the ones `make gpu_binaries` built beforehand on a CPU machine (build/gpu/: sm_90, host
#               code for x86-64-v3, one GPU and no NCCL; train_gpt_cuda_nccl beside them, used only where
#               libnccl.so.2 was found), installed if they are of these sources and start; else built here;
#               versions: the CUDA runtime, driver, cuBLASLt and NCCL the binaries run with, compute-sanitizer's
#   harness_*   each kernel against its CPU twin (attention first, then matmul, loss, elementwise, optim),
#               with XSA_CUDA_SYNC=1: a synchronisation after every launch, so a fault names its kernel
#   test_xsa_cuda  the CUDA suite: PyTorch references, identities, graphs, the CUDA trainer against the CPU one
#   model_twin  the CUDA backend against the CPU backend on one d4-size model and batch: loss, logits, every gradient
#   bench_d24_* d24 at T 2048, XSA off and on (fused), then the phases of a d24 XSA micro-step (phases_d24_xsa)
#               and the kernels' own timings at the real shapes (timing_attention, timing_matmul), with
#               nvidia-smi sampling SM/memory clocks, power and temperature every 0.5 s (row gpu_samples_d24:
#               min/median/max)
#   the rest    train_d4_learn (the trainer end to end, d4-size, learnable XSA, on the embedded data);
#               sanitizer_memcheck; bench_d12_base, bench_d12_xsa_fused, bench_d24_xsa_unfused (sampled: row
#               gpu_samples_rest); sft_chatcore (SFT of such a model on the mini conversations, ChatCORE at its
#               end); generate_d12 (sample_cuda's speed); sanitizer_racecheck, sanitizer_synccheck (all three
#               compute-sanitizer tools on the attention harness, small shapes); train_ranks2 (2+ GPUs and NCCL); torch_baseline (the PyTorch
#               reference model on the same GPU, dev/bench/torch_gpu.py: ours / PyTorch in the bench table)
# With the device tool, carry the prebuilt binaries (make gpu_binaries, then carry ["build/gpu"]) and run
#   bash dev/gpu_check.sh        (OUT is set by the tool; elsewhere OUT=/tmp/gpu_check), timeout_s 480
# The window: 15 minutes of device time = the machine's start (1-3 min) + this call (BUDGET 420 s plus the
# transfers, ~30 s) + what is left, 2-5 min, for a rerun on the still-warm machine (it goes back after 30 s
# idle): the summary's last line is its command, e.g.
#   GPU_CHECK_ONLY='bench_d12_* sanitizer_*' BUDGET=150 bash dev/gpu_check.sh     (timeout_s 180)
# GPU_CHECK_ONLY: glob patterns over the stage names above, space-separated; the set-up stages always run.
# Knobs: BUDGET, GPU_CHECK_ONLY, ITERS (benchmark iterations, 10), D12_BATCH / D24_BATCH (32), GPU_CHECK_BIN
# (build/gpu), GPU_CHECK_PYTHON (python3: whose nvidia-* packages are searched), GPU_CHECK_SMI_TIMEOUT (20).
# The CPU emulator's dry run of this script (dev/cuda/emu/run.sh gpu_check) sets GPU_CHECK_NO_GPU_OK=1 (go on
# without nvidia-smi), GPU_CHECK_SKIP_BUILD=1 (the binaries are in place) and GPU_CHECK_TINY=1 (tiny models
# for the training and benchmark stages).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export OUT=${OUT:-/tmp/gpu_check}
GPU_STAGE_TITLE="gpu_check at commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- 2>/dev/null || echo ' (+ working tree changes)')"
GPU_STAGE_ALWAYS="env libraries libraries_built binaries_prebuilt build versions"  # the set-up: run whatever GPU_CHECK_ONLY says
source dev/gpu_stage.sh
ITERS=${ITERS:-10}
D12_BATCH=${D12_BATCH:-32}
D24_BATCH=${D24_BATCH:-32}  # train_gpt's default -b at d24 on an H100/H200 (the largest that fits, up to 32)
BIN=${GPU_CHECK_BIN:-build/gpu}
JOBS=$(nproc 2>/dev/null || echo 2)
SMI_TIMEOUT=${GPU_CHECK_SMI_TIMEOUT:-20}
BENCH_TABLE=$LOGS/bench_table.md
PHASES_TABLE=$LOGS/phases_table.md
GEN_TABLE=$LOGS/generation.md
GPU_STAGE_EXTRA="$BENCH_TABLE $PHASES_TABLE $GEN_TABLE"
smi() { timeout -k 2 "$SMI_TIMEOUT" nvidia-smi "$@"; }
trap 'kill "${GPU_SAMPLE_PIDS[@]}" 2> /dev/null' EXIT  # a sampler still running when this ends

# ---- env: what the numbers below were measured on
env_report() {
    smi -q
    smi
    smi --query-gpu=name,driver_version,compute_cap,memory.total,clocks.max.sm,clocks.max.mem,power.limit,mig.mode.current,ecc.mode.current --format=csv
    command -v nvcc >/dev/null && nvcc --version
    uname -a
    grep -m1 "model name" /proc/cpuinfo
    echo "cpu flags for x86-64-v3: $(grep -m1 -o -w -e avx2 -e bmi2 -e fma -e movbe /proc/cpuinfo | sort -u | tr '\n' ' ')"
    echo "$(nproc) CPUs; driver $(smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1); $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' || echo 'no nvcc')"
}
stage env 30 bash -c "SMI_TIMEOUT=$SMI_TIMEOUT; $(declare -f smi env_report); env_report"
gpu=$(smi --query-gpu=name,driver_version,compute_cap,memory.total,clocks.max.sm,power.limit,mig.mode.current,ecc.mode.current --format=csv,noheader 2>/dev/null | head -n 1)
note device "${gpu:-no GPU: nvidia-smi found none}"
if [ -z "$gpu" ] && [ -z "${GPU_CHECK_NO_GPU_OK:-}" ]; then
    note "GPU stages" "SKIPPED: no GPU on this machine"
    exit 0
fi

# ---- libraries: found wherever this machine has them; LD_LIBRARY_PATH for every stage after this one
CHECKS=$(ls dev/cuda/*_check.cu 2>/dev/null | sed 's|dev/cuda/\(.*\)\.cu|dev/cuda/bin/\1|' | tr '\n' ' ')
BUILD_TARGETS="train_gpt_cuda test_xsa_cuda train_gpt_cpu test_xsa_cpu dev/bench/bench_fwdbwd_cuda $CHECKS"  # and sample, chat_sft
TREE_BINARIES="$BUILD_TARGETS sample_cuda chat_sft_cuda"
LIBS_ENV=$LOGS/libraries.env
libraries() {  # NAME BINARY... (those that exist; train_gpt_cuda_nccl optional)
    local name=$1 b found_args=()
    shift
    for b in "$@"; do
        [ -f "$b" ] && [ -x "$b" ] || continue
        case $b in *train_gpt_cuda_nccl) found_args+=(--optional "$b") ;; *) found_args+=("$b") ;; esac
    done
    rm -f "$LIBS_ENV"
    stage "$name" 30 bash dev/gpu/find_libs.sh --out "$LIBS_ENV" "${found_args[@]}"
    local code=$?
    # shellcheck disable=SC1090
    [ -f "$LIBS_ENV" ] && source "$LIBS_ENV"
    return $code
}
if [ -f "$BIN/SOURCES" ] && [ -z "${GPU_CHECK_SKIP_BUILD:-}" ]; then
    libraries libraries "$BIN"/*
else
    libraries libraries $TREE_BINARIES train_gpt_cuda_nccl
fi

# ---- binaries: prebuilt if they are of these sources and start, else built here
sources_hash() { sh dev/gpu_sources_hash.sh; }
install_prebuilt() {
    [ -f "$BIN/SOURCES" ] || { echo "no prebuilt binaries in $BIN (make gpu_binaries builds them)"; return 1; }
    [ "$(cat "$BIN/SOURCES")" = "$(sources_hash)" ] || { echo "$BIN was built from other sources ($(cat "$BIN/SOURCES") != $(sources_hash))"; return 1; }
    local b
    for b in "$BIN"/*; do
        [ -x "$b" ] || continue
        [ "$(basename "$b")" = train_gpt_cuda_nccl ] && continue  # optional: used only where libnccl.so.2 was found
        if ldd "$b" | grep "not found"; then echo "$b cannot start: a library is missing (see the libraries stage)"; return 1; fi
    done
    "$BIN/train_gpt_cuda" --help > /dev/null || { echo "$BIN/train_gpt_cuda does not start (exit $?)"; return 1; }
    mkdir -p dev/cuda/bin dev/bench
    cp "$BIN"/train_gpt_cuda "$BIN"/test_xsa_cuda "$BIN"/sample_cuda "$BIN"/chat_sft_cuda "$BIN"/train_gpt_cpu "$BIN"/test_xsa_cpu .
    cp "$BIN"/bench_fwdbwd_cuda dev/bench/
    cp "$BIN"/*_check dev/cuda/bin/
    touch train_gpt_cuda test_xsa_cuda sample_cuda chat_sft_cuda train_gpt_cpu test_xsa_cpu dev/bench/bench_fwdbwd_cuda dev/cuda/bin/*  # newer than the sources: make keeps them
    rm -f train_gpt_cuda_nccl
    if [ -x "$BIN/train_gpt_cuda_nccl" ] && ! ldd "$BIN/train_gpt_cuda_nccl" | grep -q "not found"; then
        cp "$BIN/train_gpt_cuda_nccl" . && echo "train_gpt_cuda_nccl installed (libnccl.so.2 found)"
    else
        echo "no train_gpt_cuda_nccl: $([ -x "$BIN/train_gpt_cuda_nccl" ] && echo "libnccl.so.2 not found" || echo "not built (no nccl.h where make gpu_binaries ran)")"
    fi
    echo "installed the prebuilt binaries of $BIN (sources $(cat "$BIN/SOURCES"))"
}
if [ -n "${GPU_CHECK_SKIP_BUILD:-}" ]; then
    note binaries "SKIPPED: GPU_CHECK_SKIP_BUILD (the binaries are in place)"
elif ! stage binaries_prebuilt 30 bash -c "BIN=$BIN; $(declare -f sources_hash install_prebuilt); install_prebuilt"; then
    # build what the stages run, for the GPU here (not make cuda_targets: its arch check compiles six
    # architectures); not where cuBLASLt is missing
    if [[ " ${GPU_LIBS_MISSING:-} " == *" libcublasLt.so.13 "* ]]; then
        note build "SKIPPED: libcublasLt.so.13 was not found (the libraries stage): what is built here would not start either"
    elif stage build 300 make -j"$JOBS" $BUILD_TARGETS sample chat_sft; then
        cp sample sample_cuda && cp chat_sft chat_sft_cuda
        rm -f train_gpt_cuda_nccl
        ldd train_gpt_cuda | grep -q libnccl && cp train_gpt_cuda train_gpt_cuda_nccl  # built with NCCL where nccl.h is
    fi
    libraries libraries_built $TREE_BINARIES train_gpt_cuda_nccl
fi

# ---- versions: the CUDA runtime, driver, cuBLASLt and NCCL the binaries run with; compute-sanitizer's
SANITIZER=$(command -v compute-sanitizer)
[ -z "$SANITIZER" ] && [ -n "$gpu" ] && SANITIZER=$(ls /usr/local/cuda*/bin/compute-sanitizer /usr/local/cuda*/compute-sanitizer/compute-sanitizer 2>/dev/null | head -n 1)
versions_report() {  # VERSIONS_BINARY
    local v cs=""
    v=$("$1") || { echo "$v"; return 1; }
    echo "$v"
    if [ -n "$SANITIZER" ]; then
        "$SANITIZER" --version
        cs=$("$SANITIZER" --version 2>/dev/null | grep -o -m1 'Version [0-9.]*' | cut -d' ' -f2)
    fi
    echo "$(echo "$v" | tail -n 1 | sed 's/;.*//'), compute-sanitizer ${cs:-not found}"
}
VERSIONS=$BIN/versions
if [ ! -x "$VERSIONS" ] && [ -z "${GPU_CHECK_SKIP_BUILD:-}" ] && command -v nvcc > /dev/null; then
    VERSIONS=$(mktemp -d)/versions
    timeout 60 nvcc -O2 dev/gpu/versions.cu -o "$VERSIONS" -ldl > "$LOGS/versions_build.log" 2>&1 || VERSIONS=""
fi
if [ -x "$VERSIONS" ]; then
    stage versions 30 bash -c "SANITIZER=$SANITIZER; $(declare -f versions_report); versions_report $VERSIONS"
else
    note versions "SKIPPED: no $BIN/versions (make gpu_binaries builds it) and no nvcc to build it"
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
stage test_xsa_cuda 180 ./test_xsa_cuda
if gpu_stage_selected model_twin; then
    TWIN=$(mktemp -d)  # 57 MB: not in the archive
    stage model_twin 90 bash -c "./test_xsa_cpu --twin-write $TWIN/twin.safetensors && XSA_CUDA_SYNC=1 ./test_xsa_cuda --twin-check $TWIN/twin.safetensors"
    rm -rf "$TWIN"
fi

# ---- benchmarks: bench_fwdbwd_cuda LAYERS DIM HEADS KV HEAD_DIM T VOCAB BATCH PATTERN SHORT ALPHA ITERS FUSED [GRAPHS [PHASES]]
bench() {  # name cap, then bench_fwdbwd_cuda's arguments
    local name=$1 cap=$2
    shift 2
    if stage "bench_$name" "$cap" dev/bench/bench_fwdbwd_cuda "$@"; then
        local log=$LOGS/bench_$name.log
        [ -f "$BENCH_TABLE" ] || bench_table_header
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
bench_table_header() {
    { echo "benchmark (bench_fwdbwd_cuda; d24 = $D24, d12 = $D12: layers dim heads kv head_dim T vocab rows pattern short window):"
      echo "a training step as train_gpt runs it (micro-steps of the rows x T, then the optimizer), medians over $ITERS iterations"
      echo
      echo "| config | tok/s | MFU | mem GiB | micro-step ms | optimizer ms | GEMMs once each, ms: cuBLASLt heuristic's first -> tuned |"
      echo "|---|---|---|---|---|---|---|"; } > "$BENCH_TABLE"
}
timing() {  # the kernels' own timings at the real shapes (no XSA_CUDA_SYNC)
    local h=$1 args
    case $h in attention) args="";; *) args="5";; esac
    [ -n "${GPU_CHECK_TINY:-}" ] && args="${args/5/1}"
    stage "timing_$h" 90 dev/cuda/bin/${h}_check $args
}
D24_STAGES="bench_d24_base bench_d24_xsa_fused phases_d24_xsa timing_attention timing_matmul"
if gpu_stage_selected $D24_STAGES; then
    gpu_sample_start gpu_samples_d24
    bench d24_base 90 $D24 0 "$ITERS" 1
    bench d24_xsa_fused 90 $D24 1 "$ITERS" 1
    if stage phases_d24_xsa 90 dev/bench/bench_fwdbwd_cuda $D24 1 5 1 1 1; then
        { echo "phases of a d24 XSA micro-step ($D24_BATCH x 2048, eager launches):"; echo; echo '```'
          sed -n '/^phases of a micro-step/,$p' "$LOGS/phases_d24_xsa.log"; echo '```'; } > "$PHASES_TABLE"
    fi
    timing attention
    timing matmul
    gpu_sample_stop gpu_samples_d24
fi

# ---- the rest
TRAIN="-d 4 -t 256 -b 4 -B 4096 -n 4 --eval-every 4 --eval-tokens 8192 --sample-every -1 --core-every -1 -x learn"
[ -n "${GPU_CHECK_TINY:-}" ] && TRAIN="-d 1 --dim 64 --heads 1 -t 64 -b 2 -B 256 -n 2 --eval-every 2 --eval-tokens 512 --sample-every -1 --core-every -1 -x learn"
stage train_d4_learn 60 env XSA_CUDA_SYNC=1 ./train_gpt_cuda $TRAIN
sanitizer() {
    stage "sanitizer_$1" 75 "$SANITIZER" --tool "$1" --error-exitcode 1 dev/cuda/bin/attention_check --no-timing --quiet --small
}
if [ -n "$SANITIZER" ]; then
    sanitizer memcheck
elif gpu_stage_selected sanitizer_memcheck sanitizer_racecheck sanitizer_synccheck; then
    note sanitizers "SKIPPED: compute-sanitizer not found"
fi
if gpu_stage_selected bench_d12_base bench_d12_xsa_fused bench_d24_xsa_unfused; then
    gpu_sample_start gpu_samples_rest
    bench d12_base 60 $D12 0 "$ITERS" 1
    bench d12_xsa_fused 60 $D12 1 "$ITERS" 1
    bench d24_xsa_unfused 90 $D24 1 "$ITERS" 0
    gpu_sample_stop gpu_samples_rest
fi
# SFT on the CUDA backend (the loss's ignored targets and its device-side mean, the packing's padding), then
# ChatCORE at its end on the embedded bundle (batched categorical forwards, greedy generation with the
# calculator tool, HumanEval's python3 test processes): both must run through; a base of the same shape first
if gpu_stage_selected sft_chatcore; then
    SFT=$(mktemp -d)
    stage sft_chatcore 90 bash -c "./train_gpt_cuda $TRAIN -o $SFT/base > /dev/null &&
            XSA_CUDA_SYNC=1 ./chat_sft_cuda --sft dev/data/sft_mini_tokens --init-from \$(ls $SFT/base/ckpt_*.safetensors | tail -n 1) -n 3 \
            --eval-every 3 --eval-tokens 4096 --chatcore-max-cat 8 --chatcore-max-sample 2 -o $SFT/sft &&
            grep -q '\"kind\": \"chatcore\"' $SFT/sft/metrics.jsonl"
    rm -rf "$SFT"
fi
# generation (sample, KV cache): a d12 model after one step on the embedded corpus, greedy from the first
# 4000 bytes of dev/data/devil/README.md (885 tokens), 256 new tokens
GEN_TRAIN="-d 12 -b 1 -B 2048 -n 1 --eval-every 1 --eval-tokens 2048 --sample-every -1 --core-every -1"
GEN_BYTES=4000
if [ -n "${GPU_CHECK_TINY:-}" ]; then
    GEN_TRAIN="-d 1 --dim 64 --heads 1 -t 64 -b 1 -B 64 -n 1 --eval-every 1 --eval-tokens 64 --sample-every -1 --core-every -1"
    GEN_BYTES=40
fi
if [ -x ./sample_cuda ] && gpu_stage_selected generate_d12; then
    GEN=$(mktemp -d)  # the 1.1 GB model: not in the archive
    if stage generate_d12 90 bash -c "./train_gpt_cuda $GEN_TRAIN --export-safetensors $GEN/model.safetensors > /dev/null &&
            head -c $GEN_BYTES dev/data/devil/README.md | ./sample_cuda -e $GEN/model.safetensors -t 0 -n 256 > /dev/null"; then
        { echo "generation (sample_cuda, d12 after one step, greedy, batch 1, the first $GEN_BYTES bytes of dev/data/devil/README.md as the prompt):"; echo
          grep "new tokens" "$LOGS/generate_d12.log"; } > "$GEN_TABLE"
    fi
    rm -rf "$GEN"
fi
if [ -n "$SANITIZER" ]; then
    sanitizer racecheck
    sanitizer synccheck
fi
gpus=$(smi -L 2>/dev/null | grep -c GPU)
if [ "${gpus:-0}" -ge 2 ] && gpu_stage_selected train_ranks2; then
    if [ -x ./train_gpt_cuda_nccl ]; then
        stage train_ranks2 60 ./train_gpt_cuda_nccl $TRAIN --ranks 2
    else
        note train_ranks2 "SKIPPED: no train_gpt_cuda_nccl (libnccl.so.2 not found, or no nccl.h where the binaries were built)"
    fi
fi
# ---- PyTorch on the same GPU (dev/bench/torch_gpu.py): the reference model's micro-step, eager and under
# torch.compile, beside ours in the benchmark table (ours / PyTorch); last: it checks nothing of ours
if gpu_stage_selected torch_baseline; then
    TORCH_PY=${TORCH_PY:-python3}
    torch_cap=$(( BUDGET - RESERVE - $(gpu_stage_elapsed) ))
    [ "$torch_cap" -gt 300 ] && torch_cap=300
    if ! timeout 60 "$TORCH_PY" -c "import torch" 2>/dev/null; then
        note torch_baseline "SKIPPED: $TORCH_PY cannot import torch"
    elif [ "$torch_cap" -lt 45 ]; then
        note torch_baseline "SKIPPED: $torch_cap s left of the budget (rerun: GPU_CHECK_ONLY=torch_baseline)"
    else
        TORCH_ARGS="--budget $(( torch_cap - 10 ))"
        [ -n "${GPU_CHECK_TINY:-}" ] && TORCH_ARGS="--tiny"
        stage torch_baseline "$torch_cap" "$TORCH_PY" dev/bench/torch_gpu.py $TORCH_ARGS
        { echo; "$TORCH_PY" dev/bench/torch_gpu.py --compare "$LOGS/torch_baseline.log" \
              d24="$LOGS/bench_d24_base.log" d12="$LOGS/bench_d12_base.log"; } >> "$BENCH_TABLE"
        gpu_stage_flush
    fi
fi
gpu_stage_flush
cat "$OUT/summary.md"
