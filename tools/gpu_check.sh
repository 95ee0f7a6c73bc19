#!/usr/bin/env bash
# tools/gpu_check.sh: the checks that need a GPU, as one script (at most 8 minutes on one H200).
#
#   tools/gpu_check.sh bundle   here, on any machine with nvcc: build for sm_90 and pack the
#                               binaries with the libraries they need into build/gpu/bundle.tar.xz
#   tools/gpu_check.sh          on the GPU machine: run the GPU tests (they must not skip), the
#                               strategy gates on the GPU, compute-sanitizer on a short run, and
#                               time the char preset (DDP on 1 GPU, ZeRO-3 on 4 simulated ranks)
#                               beside PyTorch's nanoGPT on the same GPU, and make bench's
#                               overlap table on the char preset
#
# The GPU machine may lack the Debian libraries the build needs (Criterion, cJSON, OpenBLAS)
# and reach no package registry, so the build travels: bundle here, carry build/gpu, run there.
# Where the build does work there (make deps done), the script builds in place instead.
set -uo pipefail
cd "$(dirname "$0")/.."

GPU_BUILD=build/gpu
BINARIES="train zero_memory bench_overlap test_gpu test_kernels test_strategies"

if [ "${1:-}" = bundle ]; then
    set -e
    make -j"$(nproc)" CUDA=1 CUDA_ARCH=90 OPT="-O3 -march=x86-64-v3" BUILD=$GPU_BUILD \
        $(for b in $BINARIES; do echo $GPU_BUILD/bin/$b; done)
    rm -rf $GPU_BUILD/bundle && mkdir -p $GPU_BUILD/bundle/bin $GPU_BUILD/bundle/lib
    for b in $BINARIES; do cp $GPU_BUILD/bin/$b $GPU_BUILD/bundle/bin/; done
    # every library the binaries load, but the C library's own and CUDA's (the GPU machine has those)
    for b in $BINARIES; do ldd $GPU_BUILD/bin/$b; done | awk '$3 ~ /^\// { print $3 }' | sort -u |
        grep -v -E '/(libc|libm|libmvec|libdl|librt|libresolv|libpthread|ld-linux[^/]*)\.so|cuda|nccl|cublas' |
        while read -r lib; do cp -L "$lib" $GPU_BUILD/bundle/lib/; done
    tar -C $GPU_BUILD -cJf $GPU_BUILD/bundle.tar.xz bundle
    rm -rf $GPU_BUILD/bundle
    ls -la $GPU_BUILD/bundle.tar.xz
    exit 0
fi

failed=0
step() { echo; echo "== $*"; }
check() { "$@"; local rc=$?; [ $rc -eq 0 ] || { echo "FAILED ($rc): $*"; failed=1; }; return 0; }

step "the GPU"
nvidia-smi -L || { echo "no GPU here: nothing to check"; exit 1; }

if [ -f $GPU_BUILD/bundle.tar.xz ]; then
    step "the carried build"
    rm -rf /tmp/zf_bundle && mkdir -p /tmp/zf_bundle && tar -C /tmp/zf_bundle -xJf $GPU_BUILD/bundle.tar.xz
    BIN=/tmp/zf_bundle/bundle/bin
    nccl=$(find / -name 'libnccl.so.2' -not -path '/proc/*' 2>/dev/null | head -1)
    # for our binaries only: PyTorch keeps the machine's own libraries
    LIBS=/tmp/zf_bundle/bundle/lib${nccl:+:$(dirname "$nccl")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    echo "binaries from the bundle; NCCL from ${nccl:-the system}"
else
    step "build for sm_90"
    make -j"$(nproc)" CUDA=1 CUDA_ARCH=90 BUILD=$GPU_BUILD $(for b in $BINARIES; do echo $GPU_BUILD/bin/$b; done) ||
        exit 1
    BIN=$GPU_BUILD/bin
    LIBS=${LD_LIBRARY_PATH:-}
fi
zf() { env LD_LIBRARY_PATH="$LIBS" "$@"; }

step "GPU tests (every op against the CPU, training, the gates on the GPU simulator, NCCL)"
check zf env ZF_REQUIRE_GPU=1 timeout 300 $BIN/test_gpu --verbose --jobs 1

step "compute-sanitizer on a short run (ZeRO-3, 2 simulated ranks, dropout)"
check zf timeout 240 compute-sanitizer --tool memcheck --error-exitcode 1 $BIN/train --device=cuda --zero=3 --gpus=2 \
    --layers=2 --embd=64 --heads=4 --block=64 --batch=4 --iters=3 --eval-every=0 --eval-iters=1 --sample-chars=20 \
    --dropout=0.1

step "char preset, DDP on one GPU"
check zf timeout 300 $BIN/train --preset=char --device=cuda --zero=0 --gpus=1 --iters=60 --eval-every=0 --eval-iters=0 \
    --sample-chars=0 --log-every=20

step "char preset, ZeRO-3 on 4 ranks simulated on the GPU"
check zf timeout 300 $BIN/train --preset=char --device=cuda --zero=3 --gpus=4 --batch=16 --iters=40 --eval-every=0 \
    --eval-iters=0 --sample-chars=0 --log-every=20

step "overlap table, char preset, ranks simulated on the GPU over a modeled link"
check zf timeout 300 $BIN/bench_overlap --preset=char --device=cuda --iters=5

step "PyTorch nanoGPT, char preset, same GPU, fp32"
check timeout 300 python3 tools/torch_gpt.py bench --preset char --device cuda --iters 40

echo
[ $failed -eq 0 ] && echo "gpu_check: all passed" || echo "gpu_check: FAILED (see above)"
exit $failed
