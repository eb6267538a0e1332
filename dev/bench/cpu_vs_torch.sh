#!/usr/bin/env bash
# The CPU backend against PyTorch on the same machine, thread count, model and batch, run one after the other
# in this one script: first the kernels (dev/bench/bench_cpu_kernels beside bench_torch_kernels.py: each
# Linear layer, attention, the loss, in GFLOP/s against the FMA peak measured on this machine), then the
# training micro-step (forward + backward) in tokens/s, ours (dev/bench/bench_fwdbwd) against three PyTorch
# columns of dev/bench/bench_torch.py: the reference model as written (attention materialises the scores),
# the same with F.scaled_dot_product_attention ("sdpa"), and that under torch.compile ("compile"; where
# COMPILE_CONFIGS lists the configuration). The ratio is ours over the fastest PyTorch column.
#   bash dev/bench/cpu_vs_torch.sh
# Settings (environment): THREADS (default "1 2"), CONFIGS (default "bench d12"), ITERS (median of, default 5;
# 3 for d12), COMPILE_CONFIGS (default "bench"; compiling the d12 model takes minutes), PY (the Python with
# torch; default: the benchmark venv of dev/bench/torch_venv.sh if set up, else python3). Configurations:
#   bench: 4 layers, dim 256, 4 heads of 64, T 256, vocab 8192, batch 4, SSSL windows (short 128), XSA off and alpha 1
#   d12:   12 layers, dim 768, 12 heads of 64, T 512, vocab 32768, batch 2, SSSL windows (short 128), XSA off
# Both with value embeddings and smear. Run it on an otherwise idle machine (pause other jobs with kill -STOP).
set -euo pipefail
cd "$(dirname "$0")/../.."
THREADS=${THREADS:-1 2}
CONFIGS=${CONFIGS:-bench d12}
COMPILE_CONFIGS=${COMPILE_CONFIGS:-bench}
if [ -z "${PY:-}" ]; then
    if [ -x "${TORCH_VENV:-$HOME/.cache/xsa-train/torch-venv}/bin/python" ]; then PY="bash dev/bench/torch_venv.sh python"; else PY=python3; fi
fi

make -s dev/bench/bench_fwdbwd dev/bench/bench_cpu_kernels
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(grep -o -w -E 'avx512f|avx2|fma' /proc/cpuinfo | sort -u | tr '\n' ' ')"
$PY -c "import torch; print('torch', torch.__version__, '| BLAS:', next((l.split('BLAS_INFO=')[1].split(',')[0] for l in torch.__config__.show().splitlines() if 'BLAS_INFO=' in l), '?'), '| CPU capability:', torch.backends.cpu.get_cpu_capability())" 2>/dev/null ||
    { echo "error: $PY cannot import torch: set up the benchmark's PyTorch with bash dev/bench/torch_venv.sh setup (or set PY)"; exit 1; }
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo ?)$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)'), $(date -u '+%Y-%m-%d %H:%M UTC')"

config_args() {  # $1 = config -> sets LAYERS DIM HEADS HEAD_DIM T VOCAB BATCH SHORT ALPHAS CITERS
    case "$1" in
    bench) LAYERS=4 DIM=256 HEADS=4 HEAD_DIM=64 T=256 VOCAB=8192 BATCH=4 SHORT=128 ALPHAS="0 1" CITERS=${ITERS:-5} ;;
    d12) LAYERS=12 DIM=768 HEADS=12 HEAD_DIM=64 T=512 VOCAB=32768 BATCH=2 SHORT=128 ALPHAS="0" CITERS=${ITERS:-3} ;;
    *) echo "error: unknown configuration '$1' (bench or d12)"; exit 1 ;;
    esac
}

rows=()
for config in $CONFIGS; do
    config_args "$config"
    for threads in $THREADS; do
        echo
        echo "== $config, $threads thread(s): kernels at M = $((BATCH * T)) tokens =="
        kernels=$(OMP_NUM_THREADS=$threads dev/bench/bench_cpu_kernels $DIM $HEADS $HEAD_DIM $T $VOCAB $BATCH $SHORT $CITERS)
        echo "-- ours"
        echo "$kernels"
        echo "-- PyTorch"
        OMP_NUM_THREADS=$threads $PY dev/bench/bench_torch_kernels.py $DIM $HEADS $HEAD_DIM $T $VOCAB $BATCH $SHORT $CITERS
        peak=$(echo "$kernels" | sed -n 's/^fma peak GFLOP\/s \([0-9.]*\) .*/\1/p')
        for alpha in $ALPHAS; do
            ours=$(OMP_NUM_THREADS=$threads dev/bench/bench_fwdbwd $LAYERS $DIM $HEADS $HEADS $HEAD_DIM $T $VOCAB $BATCH SSSL $SHORT "$alpha" "$CITERS")
            ours_rate=$(echo "$ours" | sed -n 's/^ours tok\/s \([0-9.]*\) .*/\1/p')
            flops=$(echo "$ours" | sed -n 's/^flops\/token \([0-9.e+]*\).*/\1/p')
            torch_args="--layers $LAYERS --dim $DIM --heads $HEADS --kv-heads $HEADS --head-dim $HEAD_DIM --seq-len $T --vocab $VOCAB
                        --window-pattern SSSL --short-window $SHORT --batch $BATCH --xsa-alpha $alpha --threads $threads --iters $CITERS"
            torch_rate() {  # extra flags of bench_torch.py -> tok/s
                OMP_NUM_THREADS=$threads $PY dev/bench/bench_torch.py $torch_args "$@" | sed -n 's/^torch tok\/s \([0-9.]*\) .*/\1/p'
            }
            reference=$(torch_rate)
            sdpa=$(torch_rate --attention sdpa)
            compiled="-"
            case " $COMPILE_CONFIGS " in *" $config "*) compiled=$(torch_rate --attention sdpa --compile --warmup 3) ;; esac
            rows+=("$(awk -v c="$config" -v t="$threads" -v a="$alpha" -v o="$ours_rate" -v f="$flops" -v p="$peak" -v r="$reference" \
                -v s="$sdpa" -v k="$compiled" 'BEGIN {
                    best = r > s ? r : s; if (k != "-" && k + 0 > best) best = k + 0
                    printf "| %s | %s | %s | %.0f | %.1f (%.0f%%) | %.0f | %.0f | %s | %.2fx |", c, t, a == 0 ? "off" : "alpha " a, o,
                        o * f / 1e9, 100 * o * f / 1e9 / p, r, s, k == "-" ? "-" : sprintf("%.0f", k), o / best }')")
        done
    done
done
echo
echo "== training micro-step (forward + backward), tokens/s; GFLOP/s: nanochat's FLOPs per token (6 N + attention) x tok/s, % of the measured FMA peak =="
echo "| config | threads | XSA | ours tok/s | ours GFLOP/s (% peak) | PyTorch reference | PyTorch sdpa | PyTorch sdpa + compile | ours / fastest PyTorch |"
echo "|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
