#!/usr/bin/env bash
# The benchmark baseline: a current PyTorch from PyPI in its own virtual environment, for the side-by-side
# benchmarks (dev/bench/bench_generate.py; Debian's python3-torch is older and only serves the tests'
# reference files).
#   bash dev/bench/torch_venv.sh setup            creates $TORCH_VENV (default ~/.cache/xsa-train/torch-venv)
#   bash dev/bench/torch_venv.sh python ARGS...   runs its python with ARGS
# PyPI's Linux torch wheel is built with CUDA and loads the CUDA libraries at import even on a CPU-only
# machine. The wheels of the libraries it needs are installed beside it, and where no NVIDIA driver is
# installed, the CUDA toolkit's libcuda stub (found under the nvcc install) stands in for libcuda.so.1,
# so that torch imports and runs on the CPU (torch.cuda.is_available() is False).
set -euo pipefail
VENV=${TORCH_VENV:-$HOME/.cache/xsa-train/torch-venv}
SP() { "$VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])'; }

case "${1:-}" in
setup)
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
    # torch's full dependency set pulls ~3 GB of CUDA wheels; running on the CPU needs only the libraries its
    # shared objects link (at the versions torch pins) and the pure-Python packages
    "$VENV/bin/pip" install -q --no-deps torch
    pins=$("$VENV/bin/python" -c 'import importlib.metadata as m, re
print(" ".join(re.sub(r";.*", "", r).replace(" ", "") for r in m.requires("torch") if re.match(r"nvidia-(cusparselt|nvshmem|nccl)", r)))')
    "$VENV/bin/pip" install -q --no-deps $pins nvidia-cufile
    "$VENV/bin/pip" install -q numpy filelock typing-extensions sympy networkx jinja2 fsspec
    if ! ldconfig -p | grep -q 'libcuda.so.1'; then
        stub=$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")/../lib64/stubs/libcuda.so
        [ -e "$stub" ] || { echo "error: no NVIDIA driver and no CUDA toolkit stub ($stub) for torch's libcuda.so.1"; exit 1; }
        mkdir -p "$VENV/stubs" && ln -sf "$(readlink -f "$stub")" "$VENV/stubs/libcuda.so.1"
    fi
    bash "$0" python -c 'import torch; print("torch", torch.__version__, "in", "'"$VENV"'")'
    ;;
python)
    shift
    [ -x "$VENV/bin/python" ] || { echo "error: no PyTorch virtual environment in $VENV: run bash dev/bench/torch_venv.sh setup"; exit 1; }
    sp=$(SP)
    cuda_lib=$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")/../lib64
    export LD_LIBRARY_PATH="$sp/nvidia/nccl/lib:$sp/nvidia/cu13/lib:$sp/nvidia/nvshmem/lib:$cuda_lib:$VENV/stubs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    # with the stub, torch's first autograd call warns that the driver is a stub: expected here
    [ -e "$VENV/stubs/libcuda.so.1" ] && export PYTHONWARNINGS="ignore:CUDA initialization${PYTHONWARNINGS:+,$PYTHONWARNINGS}"
    exec "$VENV/bin/python" "$@"
    ;;
*)
    echo "usage: bash dev/bench/torch_venv.sh setup | python ARGS..."
    exit 1
    ;;
esac
