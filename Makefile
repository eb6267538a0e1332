# xsa-train build. `make train_gpt` picks the backend for this machine; `make test` builds and runs the
# test suite: the CPU backend's always, every CUDA target compiled whenever nvcc exists (warnings are
# errors), and the CUDA backend's tests run when a GPU is present.

CXX ?= g++
# -march=native: the CPU backend's matmul and attention loops are written to be auto-vectorised for the
# build machine. No -ffast-math: the tests compare with a float64 reference and rely on IEEE semantics
# (alpha = 0 must be bit-identical to XSA off).
CXXFLAGS ?= -O3 -march=native -std=c++17 -Wall -Wextra -Werror
OMPFLAGS = -fopenmp
# the test, evaluation and benchmark programs include train_gpt.cu as a library and use only part of it
LIBFLAGS = -Wno-unused-function
HEADERS = $(wildcard *.cuh *.h llmc/*.cuh llmc/*.h)

# CUDA: nvcc if installed; the architecture of the GPU present (nvidia-smi), else Hopper (H100/H200)
NVCC ?= nvcc
HAS_NVCC := $(shell command -v $(NVCC) >/dev/null 2>&1 && echo 1)
HAS_GPU := $(shell nvidia-smi -L 2>/dev/null | grep -q GPU && echo 1)
GPU_CC := $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d '. ')
CUDA_ARCH ?= $(if $(GPU_CC),sm_$(GPU_CC),sm_90)
NVCCFLAGS ?= -O3 -std=c++17 -arch=$(CUDA_ARCH) -Xcompiler -Wall,-Wextra,-fopenmp,-march=native -Werror all-warnings
NVCC_LIBFLAGS = -Xcompiler -Wno-unused-function -diag-suppress 177
# NCCL (train_gpt --ranks N on N GPUs): used when its header is found next to nvcc's or in /usr/include
NCCL_HEADER := $(firstword $(wildcard $(dir $(shell command -v $(NVCC) 2>/dev/null))../include/nccl.h /usr/include/nccl.h))
CUDA_LIBS = -lcublasLt -lgomp $(if $(NCCL_HEADER),-lnccl)
NVCCFLAGS += $(if $(NCCL_HEADER),-DXSA_NCCL)
CUDA_CHECKS = $(patsubst dev/cuda/%.cu,dev/cuda/bin/%,$(wildcard dev/cuda/*_check.cu))

.PHONY: all test test_cuda cuda_targets bench clean train_gpt emu_test

all: train_gpt_cpu eval_core test_xsa_cpu

# The backend that suits this machine, and which one it is.
train_gpt:
ifeq ($(HAS_GPU),1)
	@echo "train_gpt: GPU found (compute capability $(GPU_CC)); building the CUDA backend for $(CUDA_ARCH)"
	$(MAKE) --no-print-directory train_gpt_cuda
	cp train_gpt_cuda train_gpt
else
	@echo "train_gpt: no GPU found; building the CPU backend (fp32, OpenMP)"
	$(MAKE) --no-print-directory train_gpt_cpu
	cp train_gpt_cpu train_gpt
endif

train_gpt_cpu: train_gpt.cu $(HEADERS)
	$(CXX) $(CXXFLAGS) $(OMPFLAGS) -x c++ train_gpt.cu -o $@

eval_core: eval_core.cpp train_gpt.cu $(HEADERS)
	$(CXX) $(CXXFLAGS) $(LIBFLAGS) $(OMPFLAGS) eval_core.cpp -o $@

test_xsa_cpu: test_xsa.cu train_gpt.cu $(HEADERS)
	$(CXX) $(CXXFLAGS) $(LIBFLAGS) $(OMPFLAGS) -x c++ test_xsa.cu -o $@

train_gpt_cuda: train_gpt.cu $(HEADERS)
	$(NVCC) $(NVCCFLAGS) train_gpt.cu -o $@ $(CUDA_LIBS)

eval_core_cuda: eval_core.cpp train_gpt.cu $(HEADERS)
	$(NVCC) $(NVCCFLAGS) $(NVCC_LIBFLAGS) -x cu eval_core.cpp -o $@ $(CUDA_LIBS)

test_xsa_cuda: test_xsa.cu train_gpt.cu $(HEADERS)
	$(NVCC) $(NVCCFLAGS) $(NVCC_LIBFLAGS) -x cu test_xsa.cu -o $@ $(CUDA_LIBS)

# the kernel harnesses: each CUDA op against its CPU twin on random inputs, with timings (GPU only)
dev/cuda/bin/%: dev/cuda/%.cu dev/cuda/check_util.cuh $(HEADERS)
	@mkdir -p dev/cuda/bin
	$(NVCC) $(NVCCFLAGS) $(NVCC_LIBFLAGS) -I. $< -o $@ $(CUDA_LIBS)

dev/bench/bench_fwdbwd_cuda: dev/bench/bench_fwdbwd.cu train_gpt.cu $(HEADERS)
	$(NVCC) $(NVCCFLAGS) $(NVCC_LIBFLAGS) dev/bench/bench_fwdbwd.cu -o $@ $(CUDA_LIBS)

cuda_targets: train_gpt_cuda eval_core_cuda test_xsa_cuda dev/bench/bench_fwdbwd_cuda $(CUDA_CHECKS)

# the CPU suite runs last, so that its "N passed, N failed" closes the output
# where no GPU is, the CUDA kernels still run: on the CPU emulator (emu_test, about 2 minutes)
test: test_xsa_cpu train_gpt_cpu eval_core
ifeq ($(HAS_NVCC),1)
	$(MAKE) --no-print-directory cuda_targets
else
	@echo "nvcc not found: CUDA targets not compiled"
endif
ifeq ($(HAS_GPU),1)
	./test_xsa_cuda
else
	@echo "no GPU here: the CUDA kernels run on the CPU emulator (the real CUDA tests: dev/gpu_check.sh on a GPU machine)"
	$(MAKE) --no-print-directory emu_test
endif
	./test_xsa_cpu

dev/bench/bench_fwdbwd: dev/bench/bench_fwdbwd.cu train_gpt.cu $(HEADERS)
	$(CXX) $(CXXFLAGS) $(LIBFLAGS) $(OMPFLAGS) -x c++ dev/bench/bench_fwdbwd.cu -o $@

# forward+backward tokens/s of the CPU backend against PyTorch, side by side (needs python3-torch)
bench: dev/bench/bench_fwdbwd
	bash dev/bench/cpu_vs_torch.sh

clean:
	rm -rf train_gpt train_gpt_cpu train_gpt_cuda eval_core eval_core_cuda test_xsa_cpu test_xsa_cuda \
	       dev/bench/bench_fwdbwd dev/bench/bench_fwdbwd_cuda dev/cuda/bin

# The CUDA code on the CPU emulator (dev/cuda/emu/README.md), no GPU needed: the emulator's self-test and
# the kernel harnesses that finish in about 2 minutes on two cores (optim, attention, test_xsa and train
# take longer: dev/cuda/emu/run.sh all). Fails on any failed check or hazard.
EMU_TEST_TARGETS = selftest loss elementwise matmul
emu_test:
	dev/cuda/emu/run.sh $(EMU_TEST_TARGETS)
