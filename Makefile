# zerofiber: GNU Make only. `make`, `make test`, `make bench`, `make test-asan`,
# `make test-tsan`, `make mutate`, `make deps`, `make clean`.
#
# CUDA=1 builds the CUDA backend too (CUDA kernels, cuBLAS, NCCL); it is the
# default when nvcc is found, on PATH or under /usr/local/cuda. CUDA=0 builds
# and runs without any CUDA at all. Either way the binaries start without a GPU.
# CUDA_ARCH lists the GPU architectures to build for (default: A100 and H100/H200).

NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA ?= $(if $(NVCC),1,0)
CUDA_HOME ?= $(abspath $(dir $(NVCC))..)
CUDA_ARCH ?= 80 90

# MPI=1 (the default) joins processes through Open MPI when mpirun or srun
# starts them (runtime/world.h); MPI=0 builds one-process binaries (the GPU
# bundle, whose machine has no MPI).
MPI ?= 1

BUILD ?= build/$(if $(filter 1,$(CUDA)),cuda,cpu)$(if $(filter 0,$(MPI)),-nompi)
CC = gcc
OPT ?= -O3 -march=native
SAN ?=
BLAS_DIR = /usr/lib/x86_64-linux-gnu/openblas-openmp
BLAS_INC = /usr/include/x86_64-linux-gnu/openblas-openmp
MPI_DIR = /usr/lib/x86_64-linux-gnu/openmpi
CFLAGS = -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror $(OPT) -fno-math-errno -fopenmp $(SAN) -I$(BLAS_INC) \
         $(CFLAGS_CUDA) $(CFLAGS_MPI) -MMD -MP
LDFLAGS = -fopenmp $(SAN) -L$(BLAS_DIR) -Wl,-rpath,$(BLAS_DIR)
LDLIBS = -ljansson -lpcre2-8 -lopenblas $(LDLIBS_CUDA) $(LDLIBS_MPI) -lpthread -lmvec -lm

# Without the Debian packages, say what to do instead of failing on a missing
# header (make deps and make clean need none of them).
REQUIRED_HEADERS = $(BLAS_INC)/cblas.h /usr/include/jansson.h /usr/include/pcre2.h /usr/include/criterion/criterion.h \
                   $(if $(filter 1,$(MPI)),$(MPI_DIR)/include/mpi.h)
MISSING_HEADERS = $(filter-out $(wildcard $(REQUIRED_HEADERS)),$(REQUIRED_HEADERS))
ifneq ($(MISSING_HEADERS),)
ifneq ($(filter-out deps clean,$(or $(MAKECMDGOALS),all)),)
$(error $(MISSING_HEADERS) not found: run `make deps` first (as root), which installs the packages the build needs)
endif
endif

RUNTIME = runtime/host.c runtime/device.c runtime/device_cpu.c runtime/arena.c runtime/rank_threads.c runtime/trace.c \
          runtime/profile.c \
          runtime/process_group.c runtime/process_group_order.c runtime/process_group_simulator.c \
          runtime/process_group_exchange.c runtime/process_group_placement.c runtime/link_model.c runtime/world.c \
          runtime/inject.c
ifeq ($(MPI),1)
RUNTIME += runtime/world_mpi.c
CFLAGS_MPI = -I$(MPI_DIR)/include
LDLIBS_MPI = -L$(MPI_DIR)/lib -Wl,-rpath,$(MPI_DIR)/lib -lmpi
else
RUNTIME += runtime/world_none.c
endif
KERNELS = kernels/kernels.c kernels/token_buckets.c $(wildcard kernels/cpu/*.c)
ifeq ($(CUDA),1)
CUDA_SRC = runtime/device_cuda.cu runtime/gpu_libraries.c runtime/process_group_nccl.c runtime/world_nccl.c \
           $(wildcard kernels/cuda/*.cu)
CFLAGS_CUDA = -I$(CUDA_HOME)/include
# Machine code for each CUDA_ARCH, and PTX of the last for newer GPUs to compile
# at load. No fused multiply-adds in our kernels (-fmad=false): gcc does not
# fuse them in C11 either, so the GPU's elementwise ops round as the CPU's. A
# kernel that spills registers or uses local memory fails the build (ptxas's
# warnings as errors): such a kernel is slow in a way no test shows.
NVCCFLAGS = -O3 -std=c++17 -fmad=false $(foreach a,$(CUDA_ARCH),-gencode arch=compute_$(a),code=sm_$(a)) \
            -gencode arch=compute_$(lastword $(CUDA_ARCH)),code=compute_$(lastword $(CUDA_ARCH)) \
            -Xptxas -warn-spills,-warn-lmem-usage,-Werror \
            -Werror all-warnings -Xcompiler -Wall,-Wextra,-Werror -MMD -MP
# cudart linked in (static); cuBLAS and NCCL loaded at their first use (runtime/gpu_libraries.h), found on
# LD_LIBRARY_PATH, then in the toolkit's folder (the run path): a binary starts where neither is.
LDLIBS_CUDA = -Wl,-rpath,$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lstdc++
else
CUDA_SRC = runtime/cuda_absent.c kernels/cuda_absent.c
endif
MODEL = model/model.c model/models.c model/gpt.c model/gpt_layout.c model/mlp.c model/data.c model/optim.c model/sample.c model/safetensors.c model/tokenizer.c model/hf_gpt2.c
STRATEGIES = strategies/ranks.c strategies/rank_graphs.c strategies/buckets.c strategies/replicated.c \
             strategies/sharded.c strategies/strategy.c
# The training loop and the checkpoint file, above the strategies they drive.
TRAINING = training/trainer.c training/checkpoint.c training/checkpoint_file.c
LIB_SRC = $(RUNTIME) $(KERNELS) $(CUDA_SRC) $(MODEL) $(STRATEGIES) $(TRAINING) tools/options.c tools/file_identity.c
LIB_OBJ = $(addprefix $(BUILD)/,$(addsuffix .o,$(basename $(LIB_SRC))))

TESTS = test_kernels test_runtime test_collectives test_model test_train test_flags test_memory test_files test_faults test_plots test_strategies test_trace test_profile test_checkpoint test_safetensors test_tokenizer test_hf test_torch test_gpu \
        test_multiprocess
TEST_BINS = $(TESTS:%=$(BUILD)/bin/%)
# Programs the suites start (under mpirun), found beside the test binaries.
TEST_DRIVERS = $(BUILD)/bin/mpi_collectives
BINS = bin/train bin/zero_memory bin/sample bin/prepare bin/export

.PHONY: all test test-large bench bench-torch venv test-asan test-tsan fuzz valgrind mutate deps clean
BENCH_BINS = $(BUILD)/bin/bench_cpu $(BUILD)/bin/bench_overlap $(BUILD)/bin/bench_units $(BUILD)/bin/bench_mpi
all: $(BINS) $(TEST_BINS) $(TEST_DRIVERS) $(BENCH_BINS)

$(BUILD)/%.o: %.c Makefile
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/%.o: %.cu Makefile
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(BUILD)/bin/train: $(BUILD)/tools/train.o $(BUILD)/tools/run_files.o $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

$(BUILD)/bin/zero_memory: $(BUILD)/tools/zero_memory.o $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

$(BUILD)/bin/sample: $(BUILD)/tools/sample.o $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

$(BUILD)/bin/prepare: $(BUILD)/tools/prepare.o $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

$(BUILD)/bin/export: $(BUILD)/tools/export.o $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

# Always copied: bin/ holds the binaries of the last build asked for (CUDA=0 or 1),
# renamed into place (a binary that is running cannot be written over).
bin/%: $(BUILD)/bin/% FORCE
	@mkdir -p bin
	cp $< $@.tmp && mv -f $@.tmp $@

FORCE:

$(BUILD)/bin/bench_%: $(BUILD)/bench/bench_%.o $(BUILD)/bench/steps.o $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

TEST_SUPPORT = $(BUILD)/tests/reference.o $(BUILD)/tests/fixtures.o $(BUILD)/tests/inputs.o $(BUILD)/tests/stream_stress.o

$(BUILD)/bin/test_%: $(BUILD)/tests/test_%.o $(TEST_SUPPORT) $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -lcriterion -o $@

# The process group's pinned-order checks over the processes of an mpirun:
# a plain program, since MPI is joined once per process and Criterion forks
# (tests/test_multiprocess.c runs it). No Criterion in it: started from a
# test, it would take itself for one of Criterion's workers.
$(BUILD)/bin/mpi_collectives: $(BUILD)/tests/mpi_collectives.o $(BUILD)/tests/inputs.o $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

# Criterion suites; each binary runs its tests in parallel worker processes.
# The kernel and model suites run a second time on OpenBLAS's SkylakeX kernels
# where the CPU has AVX-512 and no core type is forced: the results must hold
# whichever kernels OpenBLAS picks.
test: $(TEST_BINS) $(TEST_DRIVERS) $(BINS)
	@set -e; for t in $(TEST_BINS); do echo "== $$t"; ./$$t --jobs 2; done
	@set -e; if grep -q avx512f /proc/cpuinfo && [ -z "$$OPENBLAS_CORETYPE" ]; then \
	    for t in test_kernels test_model; do echo "== $$t with OPENBLAS_CORETYPE=SkylakeX"; \
	    OPENBLAS_CORETYPE=SkylakeX ./$(BUILD)/bin/$$t --jobs 2; done; fi

bench: $(BENCH_BINS) $(BUILD)/bin/train $(BUILD)/bin/zero_memory
	bench/run.sh $(BUILD)/bin

# The char-small step against PyTorch 2.x from PyPI, in the venv of make venv
# (made when missing); make bench runs it too, where the venv is there.
bench-torch: $(BUILD)/bin/bench_cpu venv
	bench/torch_peer.sh $(BUILD)/bin

# The gates on the gpt2 preset's whole model, 124M parameters (tests/test_large.sh):
# about 11 minutes on two cores, so in neither make test nor CI.
test-large: $(BINS) venv
	tests/test_large.sh bin

# AddressSanitizer + UndefinedBehaviorSanitizer over the CPU build. One job:
# Criterion's parallel runner leaks a few bytes of its own, which would fail it.
# The processes mpirun starts (the multiprocess suite) run without leak
# detection: Open MPI leaves its plugins' memory behind at MPI_Finalize, from
# modules it has unloaded, which no suppression can name. ASan's and UBSan's
# other checks stay on there, and every one-process run keeps leak detection.
ASAN_MPIRUN = env ASAN_OPTIONS=detect_leaks=0 $(or $(ZF_MPIRUN),mpirun --allow-run-as-root --oversubscribe)
test-asan:
	$(MAKE) CUDA=0 BUILD=build/asan OPT="-O1 -g -fno-omit-frame-pointer" \
	    SAN="-fsanitize=address,undefined -fno-sanitize-recover=all" build-asan-tests
	@set -e; for t in $(TESTS); do echo "== asan $$t"; \
	    ZF_TRAIN=build/asan/bin/train ZF_ZERO_MEMORY=build/asan/bin/zero_memory ZF_SAMPLE=build/asan/bin/sample ZF_PREPARE=build/asan/bin/prepare ZF_EXPORT=build/asan/bin/export ASAN_OPTIONS=detect_leaks=1 \
	    ZF_MPIRUN="$(ASAN_MPIRUN)" ./build/asan/bin/$$t --jobs 1; done

# ThreadSanitizer over the streams and everything that uses them. Criterion
# cannot start under it (Snaipe/Criterion#274), so a plain driver runs the
# threaded paths, then bin/train. OpenMP runs one thread (OMP_NUM_THREADS=1):
# libgomp is not instrumented, and its worker threads would only yield false
# reports.
test-tsan:
	$(MAKE) CUDA=0 BUILD=build/tsan OPT="-O1 -g" SAN="-fsanitize=thread" build/tsan/bin/tsan_main build/tsan/bin/train
	TSAN_OPTIONS=halt_on_error=1 OMP_NUM_THREADS=1 ./build/tsan/bin/tsan_main
	TSAN_OPTIONS=halt_on_error=1 OMP_NUM_THREADS=1 ./build/tsan/bin/train --iters=4 --eval-every=2 \
	    --eval-iters=2 --sample-chars=20 --layers=2 --embd=32 --heads=2 --block=32 --batch=4 --dropout=0.1 \
	    --zero=3 --gpus=4 --trace=build/tsan/trace.json
	@# hybrid sharding, whose replicas of a shard copy the first one's sum, with the sums in bf16
	TSAN_OPTIONS=halt_on_error=1 OMP_NUM_THREADS=1 ./build/tsan/bin/train --iters=3 --eval-every=0 \
	    --eval-iters=1 --sample-chars=0 --layers=2 --embd=32 --heads=2 --block=32 --batch=4 \
	    --zero=3 --gpus=4 --shard-ranks=2 --reduce-dtype=bf16 --grad-accum=2

$(BUILD)/bin/tsan_main: $(BUILD)/tests/tsan_main.o $(BUILD)/tests/stream_stress.o $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

# libFuzzer over the checkpoint reader, seeded from tests/corpus (clang; new
# inputs go to build/fuzz/corpus, never into tests/). FUZZ_SECONDS bounds it.
FUZZ_SECONDS ?= 30
FUZZ_SRC = tests/fuzz_checkpoint.c model/safetensors.c training/checkpoint_file.c model/gpt_layout.c \
           runtime/arena.c runtime/host.c
fuzz: build/fuzz/fuzz_checkpoint
	@mkdir -p build/fuzz/corpus
	./build/fuzz/fuzz_checkpoint -max_total_time=$(FUZZ_SECONDS) -timeout=10 build/fuzz/corpus tests/corpus

build/fuzz/fuzz_checkpoint: $(FUZZ_SRC) $(wildcard */*.h) Makefile
	@mkdir -p $(dir $@)
	clang -std=c11 -D_GNU_SOURCE -g -O1 -Wall -Wextra -Werror -fsanitize=fuzzer,address,undefined \
	    -fno-sanitize-recover=all $(FUZZ_SRC) -ljansson -o $@

# The tests' own test: seeded bugs (tests/mutate.py), each in a scratch copy
# under build/mutate, the tests it names run on it (then `make CUDA=0 test` if
# they pass), the survivors printed. Not in CI: about 30 minutes on two cores.
mutate:
	tests/mutate.py $(MUTANTS)

.PHONY: build-asan-tests
build-asan-tests: $(TEST_BINS) $(TEST_DRIVERS) $(BUILD)/bin/train $(BUILD)/bin/zero_memory $(BUILD)/bin/sample \
                  $(BUILD)/bin/prepare $(BUILD)/bin/export

# bin/train and bin/sample under valgrind's memcheck (CI): no invalid access and
# no definite leak, over a save, a resume under another strategy, dropout,
# sampling, the log, an injected fault (which must exit 1; valgrind's own errors
# exit 99 there) and a checkpoint read back. OPENBLAS_CORETYPE and
# GOMP_SPINCOUNT are set so that the tools do not re-execute themselves to set
# them (kernels/cpu/cpu_setup.c): valgrind would not follow. The binaries are a
# CPU build of their own (CUDA=0, in build/memcheck): cuBLAS's own start-up, in
# a CUDA build, trips valgrind inside glibc's dynamic loader before main; and for
# x86-64-v3 (AVX2), not -march=native, since Debian 12's valgrind stops at the
# first AVX-512 instruction (SIGILL), which -march=native emits on a CPU that has
# them. Nothing is suppressed: OpenMP's and
# OpenBLAS's pools report no definite leak.
VALGRIND = OPENBLAS_CORETYPE=Prescott GOMP_SPINCOUNT=3000 valgrind -q --leak-check=full --errors-for-leak-kinds=definite
VALGRIND_TRAIN = build/memcheck/bin/train --layers=2 --embd=16 --heads=2 --block=16 --batch=2 --eval-iters=1 \
                 --dropout=0.1 --sample-chars=20 --out=build/valgrind
valgrind:
	$(MAKE) CUDA=0 BUILD=build/memcheck OPT="-O2 -g -march=x86-64-v3" build/memcheck/bin/train \
	    build/memcheck/bin/sample build/memcheck/bin/prepare build/memcheck/bin/export
	rm -rf build/valgrind && mkdir -p build/valgrind
	$(VALGRIND) --error-exitcode=1 $(VALGRIND_TRAIN) --iters=3 --zero=3 --gpus=3 --log=build/valgrind/log.jsonl >/dev/null
	$(VALGRIND) --error-exitcode=1 $(VALGRIND_TRAIN) --iters=5 --zero=1 --gpus=2 \
	    --resume=build/valgrind/ckpt.safetensors >/dev/null
	$(VALGRIND) --error-exitcode=99 $(VALGRIND_TRAIN) --iters=8 --zero=2 --gpus=2 --inject-fault=1:6:collective \
	    --resume=build/valgrind/ckpt.safetensors >/dev/null 2>build/valgrind/fault.err; test $$? -eq 1
	grep -q "injected fault" build/valgrind/fault.err
	$(VALGRIND) --error-exitcode=1 build/memcheck/bin/sample --ckpt=build/valgrind/ckpt.safetensors --chars=20 >/dev/null
	@# the BPE path: a tokenizer trained by the tokenizers package (make deps), a folder prepared with it, a
	@# run on its ids, and a sample that encodes and decodes
	PYTHONPATH=build/pylib python3 tests/tokenizers_reference.py train build/valgrind/tokenizer.json 300 \
	    tests/tokenizer_sample.txt
	$(VALGRIND) --error-exitcode=1 build/memcheck/bin/prepare --tokenizer=build/valgrind/tokenizer.json \
	    --data=tests/tokenizer_sample.txt --out=build/valgrind/tokens >/dev/null
	$(VALGRIND) --error-exitcode=1 $(VALGRIND_TRAIN) --sample-tokens=20 --out=build/valgrind/bpe --iters=2 --zero=3 --gpus=2 \
	    --data=build/valgrind/tokens --tokenizer=build/valgrind/tokenizer.json >/dev/null
	$(VALGRIND) --error-exitcode=1 build/memcheck/bin/sample --ckpt=build/valgrind/bpe/ckpt.safetensors \
	    --tokenizer=build/valgrind/tokenizer.json --prompt="Hello, world" --tokens=10 >/dev/null
	@# Hugging Face's GPT-2 form: that run exported as a folder, a run started from it, a sample of it
	$(VALGRIND) --error-exitcode=1 build/memcheck/bin/export --ckpt=build/valgrind/bpe/ckpt.safetensors \
	    --hf=build/valgrind/hf >/dev/null
	$(VALGRIND) --error-exitcode=1 $(VALGRIND_TRAIN) --sample-tokens=20 --out=build/valgrind/from_hf --iters=1 --zero=2 --gpus=2 \
	    --data=build/valgrind/tokens --init-from=build/valgrind/hf --tokenizer=build/valgrind/tokenizer.json >/dev/null
	$(VALGRIND) --error-exitcode=1 build/memcheck/bin/sample --ckpt=build/valgrind/hf \
	    --tokenizer=build/valgrind/tokenizer.json --prompt="Hello" --tokens=5 >/dev/null

# Debian packages the build and tests need, installed only where missing.
DEB_PACKAGES = gcc make time libopenblas-openmp-dev libcriterion-dev libjansson-dev libpcre2-dev python3-torch python3-numpy python3-venv \
               gnuplot-nox clang libclang-rt-14-dev valgrind python3-pip openmpi-bin libopenmpi-dev iproute2
deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
	    dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then echo "installing:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	else echo "deps: all present"; fi
	@# safetensors (for a test of files PyTorch writes) and tokenizers (the BPE's reference) are not in
	@# Debian 12: from PyPI, into build/pylib
	@PYTHONPATH=build/pylib python3 -c 'import safetensors, tokenizers' 2>/dev/null || \
	    python3 -m pip install -q --upgrade --target build/pylib safetensors tokenizers
	@$(MAKE) --no-print-directory venv

# PyTorch 2.x, transformers, safetensors, tokenizers and NumPy from PyPI, in a
# venv made once per machine outside the clone (ZF_VENV), so that every clone,
# CI's too, finds it: the transformers tests (tests/test_hf.c) and the PyTorch
# 2.x peer of make bench run there. PyPI's Linux wheel of PyTorch brings its
# CUDA libraries along: about 5.6 GB, a few minutes the first time. An
# incomplete venv (a cut-short install) is made again.
ZF_VENV ?= $(HOME)/.cache/zerofiber/venv
export ZF_VENV
VENV_PACKAGES = 'torch>=2' 'transformers>=4.40' safetensors tokenizers numpy
venv:
	@if $(ZF_VENV)/bin/python -c 'import torch, transformers, safetensors, tokenizers, numpy' 2>/dev/null; then \
	    echo "venv: $(ZF_VENV) holds PyTorch and transformers"; \
	else echo "venv: making $(ZF_VENV) (PyTorch 2.x and transformers from PyPI, about 5.6 GB)"; \
	    rm -rf $(ZF_VENV) && mkdir -p $(dir $(ZF_VENV)) && /usr/bin/python3 -m venv $(ZF_VENV) && \
	    $(ZF_VENV)/bin/pip install -q $(VENV_PACKAGES) || { rm -rf $(ZF_VENV); \
	    echo "venv: pip could not install $(VENV_PACKAGES) into $(ZF_VENV)" >&2; exit 1; }; fi

clean:
	rm -rf build bin

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
