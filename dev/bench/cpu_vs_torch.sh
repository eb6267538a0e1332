#!/usr/bin/env bash
# Forward+backward tokens/s of the CPU backend against the PyTorch reference model, on the same model,
# batch and thread count, run one after the other in this script. Prints a table and the ratio.
#   bash dev/bench/cpu_vs_torch.sh            (THREADS=2 ITERS=10 by default)
# Needs python3-torch; install libopenblas0-pthread too, or PyTorch runs on Debian's reference BLAS
# and the comparison flatters us.
set -euo pipefail
cd "$(dirname "$0")/../.."
THREADS=${THREADS:-2}
ITERS=${ITERS:-10}
PY=${PY:-/usr/bin/python3}

# dim 256, 4 layers, T 256, 4 heads of 64, vocab 8192, batch 4, SSSL windows (short = 128), VE + smear on
OURS_ARGS="4 256 4 4 64 256 8192 4 SSSL 128"  # layers dim heads kv-heads head-dim T vocab batch pattern short-window
TORCH_ARGS="--layers 4 --dim 256 --heads 4 --kv-heads 4 --head-dim 64 --seq-len 256 --vocab 8192 --window-pattern SSSL --short-window 128 --batch 4"

make -s dev/bench/bench_fwdbwd
blas=$($PY -c "import torch; print(torch.__config__.show())" | grep -o 'BLAS_INFO=[a-z]*' || echo "BLAS_INFO=?")
blaslib=$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || echo "?")
echo "threads $THREADS, iterations $ITERS; torch $blas, libblas.so.3 -> $blaslib"

ours_rate() {  # $1 = alpha
    OMP_NUM_THREADS=$THREADS dev/bench/bench_fwdbwd $OURS_ARGS "$1" "$ITERS" | sed -n 's/^ours tok\/s \([0-9.]*\) .*/\1/p'
}
# OPENBLAS_CORETYPE/L2_SIZE (set on some machines to protect old OpenBLAS builds) slow PyTorch's GEMMs
# down; unset them for its run alone, so we compare with the strongest baseline.
torch_rate() {
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OMP_NUM_THREADS=$THREADS $PY dev/bench/bench_torch.py $TORCH_ARGS --xsa-alpha "$1" --threads "$THREADS" --iters "$ITERS" \
        | sed -n 's/^torch tok\/s \([0-9.]*\) .*/\1/p'
}

printf "%-22s %14s %14s %8s\n" "config" "ours tok/s" "torch tok/s" "ratio"
for alpha in 0 1; do
    ours=$(ours_rate $alpha)
    torch=$(torch_rate $alpha)
    awk -v a="$alpha" -v o="$ours" -v t="$torch" 'BEGIN { printf "%-22s %14.0f %14.0f %7.2fx\n", "XSA alpha " a, o, t, o / t }'
done
