# xsa-train build. `make train_gpt` picks the backend for this machine; `make test` builds and runs the
# test suite (CPU backend; the CUDA tests join it with issue #6).

CXX ?= g++
# -march=native: the CPU backend's matmul and attention loops are written to be auto-vectorised for the
# build machine. No -ffast-math: the tests compare with a float64 reference and rely on IEEE semantics
# (alpha = 0 must be bit-identical to XSA off).
CXXFLAGS ?= -O3 -march=native -std=c++17 -Wall -Wextra -Werror
OMPFLAGS = -fopenmp
# the test and benchmark programs include train_gpt.cu as a library and use only part of it
LIBFLAGS = -Wno-unused-function
HEADERS = $(wildcard *.cuh *.h)

HAS_GPU := $(shell nvidia-smi -L 2>/dev/null | grep -q GPU && echo 1)

.PHONY: all test bench clean train_gpt

all: train_gpt_cpu eval_core test_xsa_cpu

# The backend that suits this machine. The CUDA backend arrives with issue #6; until then a GPU
# machine gets the CPU build too, and is told so.
train_gpt:
ifeq ($(HAS_GPU),1)
	@echo "train_gpt: a GPU is present, but the CUDA backend is not implemented yet (issue #6); building the CPU backend"
else
	@echo "train_gpt: no GPU found; building the CPU backend (fp32, OpenMP)"
endif
	$(MAKE) --no-print-directory train_gpt_cpu
	cp train_gpt_cpu train_gpt

train_gpt_cpu: train_gpt.cu $(HEADERS)
	$(CXX) $(CXXFLAGS) $(OMPFLAGS) -x c++ train_gpt.cu -o $@

eval_core: eval_core.cpp train_gpt.cu $(HEADERS)
	$(CXX) $(CXXFLAGS) $(LIBFLAGS) $(OMPFLAGS) eval_core.cpp -o $@

test_xsa_cpu: test_xsa.cu train_gpt.cu $(HEADERS)
	$(CXX) $(CXXFLAGS) $(LIBFLAGS) $(OMPFLAGS) -x c++ test_xsa.cu -o $@

test: test_xsa_cpu train_gpt_cpu eval_core
	./test_xsa_cpu

dev/bench/bench_fwdbwd: dev/bench/bench_fwdbwd.cu train_gpt.cu $(HEADERS)
	$(CXX) $(CXXFLAGS) $(LIBFLAGS) $(OMPFLAGS) -x c++ dev/bench/bench_fwdbwd.cu -o $@

# forward+backward tokens/s of the CPU backend against PyTorch, side by side (needs python3-torch)
bench: dev/bench/bench_fwdbwd
	bash dev/bench/cpu_vs_torch.sh

clean:
	rm -f train_gpt train_gpt_cpu eval_core test_xsa_cpu dev/bench/bench_fwdbwd
