#!/usr/bin/env bash
# tools/gpu_check.sh: the checks that need a GPU, as one script that fits one GPU lease.
#
#   tools/gpu_check.sh bundle     here, on any machine with nvcc: build for sm_90 and pack the
#                                 binaries with the libraries they need into build/gpu/bundle.tar.xz
#   tools/gpu_check.sh --dry-run  here: everything that can be checked without a GPU (the bundle
#                                 unpacks, every binary resolves its libraries against the bundle
#                                 and a CUDA toolkit folder only, the steps and their total timeout)
#   tools/gpu_check.sh            on the GPU machine (carry build/gpu/bundle.tar.xz): the steps below
#
# The GPU machine has CUDA, and cuBLAS and NCCL in its toolkit or its Python venv, but no
# Criterion, Jansson or OpenBLAS, and reaches no package registry: so the binaries travel with
# their libraries. cudart is linked in statically (Makefile); cuBLAS and NCCL are found there,
# in the CUDA toolkit's folders first, then the venv's nvidia/*/lib; the C and C++ runtimes
# (libc, libstdc++, libgcc_s) are the machine's own, which are newer than ours.
#
# Every step has a timeout and prints one line, PASS, FAIL or REFUSED, with its time (and a
# passing step's figure: the tests' synthesis, the last ms/iter line); the
# timeouts add up to at most 480 s, the GPU tests first. The full output goes to
# $OUT/gpu_check.log (OUT defaults to build/gpu/out) as it runs, so a run killed from outside
# still leaves what it did. compute-sanitizer is REFUSED, not FAILED, where the machine's
# runtime does not let it reach the device (gVisor: "Device not supported", error 999).
set -uo pipefail
cd "$(dirname "$0")/.."

GPU_BUILD=build/gpu
BUNDLE=$GPU_BUILD/bundle.tar.xz
BINARIES="train zero_memory test_gpu"
BUDGET_S=480
SETUP_S=30   # on the GPU machine, before the steps: unpack (20 s) and find the libraries (10 s)
OUT=${OUT:-$GPU_BUILD/out}
mkdir -p "$OUT"
LOG=$OUT/gpu_check.log
: >"$LOG"

# The steps: name, timeout in seconds, command (run from the repository root, $BIN the binaries).
STEPS=(
    "gpu-tests|150|env ZF_REQUIRE_GPU=1 \$BIN/test_gpu --verbose --jobs 1"
    "compute-sanitizer|75|compute-sanitizer --tool memcheck --error-exitcode 1 \$BIN/train --device=cuda --zero=3 --gpus=2 --layers=2 --embd=64 --heads=4 --block=64 --batch=4 --iters=2 --eval-every=0 --eval-iters=1 --sample-chars=8 --dropout=0.1"
    "char-ddp-1gpu|60|\$BIN/train --preset=char --device=cuda --zero=0 --gpus=1 --iters=60 --eval-every=0 --eval-iters=0 --sample-chars=0 --log-every=20"
    "char-zero3-4sim|60|\$BIN/train --preset=char --device=cuda --zero=3 --gpus=4 --batch=16 --iters=40 --eval-every=0 --eval-iters=0 --sample-chars=0 --log-every=20"
    "zero-memory-cuda|30|\$BIN/zero_memory --device=cuda"
    "torch-nanogpt-char|75|python3 tools/torch_gpt.py bench --preset char --device cuda --iters 40"
)

say() { echo "$*" | tee -a "$LOG"; }

# The GPU machine has no MPI: the bundle is built without it (MPI=0, one process).
# Libraries of ours the bundle carries: everything the binaries load, but the C library's
# family, the C++ runtime and CUDA's own (the GPU machine has newer ones).
NOT_BUNDLED='/(libc|libm|libmvec|libdl|librt|libresolv|libpthread|libutil|ld-linux[^/]*|libstdc\+\+|libgcc_s)\.so|/lib(cuda|cudart|cublas|cublasLt|nccl)\.so'

bundle() {
    make -j"$(nproc)" CUDA=1 MPI=0 CUDA_ARCH=90 OPT="-O3 -march=x86-64-v3" BUILD=$GPU_BUILD \
        $(for b in $BINARIES; do echo $GPU_BUILD/bin/$b; done) >>"$LOG" 2>&1 || return 1
    local newest=""
    for b in $BINARIES; do [ -f "$BUNDLE" ] && [ $GPU_BUILD/bin/$b -ot "$BUNDLE" ] || newest=$b; done
    [ -z "$newest" ] && { echo "bundle: $BUNDLE is newer than its binaries, kept" >>"$LOG"; return 0; }
    rm -rf $GPU_BUILD/bundle && mkdir -p $GPU_BUILD/bundle/bin $GPU_BUILD/bundle/lib || return 1
    for b in $BINARIES; do cp $GPU_BUILD/bin/$b $GPU_BUILD/bundle/bin/ || return 1; done
    for b in $BINARIES; do ldd $GPU_BUILD/bin/$b; done | awk '$3 ~ /^\// { print $3 }' | sort -u |
        grep -v -E "$NOT_BUNDLED" | while read -r lib; do cp -L "$lib" $GPU_BUILD/bundle/lib/ || exit 1; done ||
        return 1
    tar -C $GPU_BUILD -cJf "$BUNDLE" bundle && rm -rf $GPU_BUILD/bundle
}

# Folders that may hold cuBLAS and NCCL: the CUDA toolkit's, then the Python venv's
# nvidia/*/lib (asked of python3, then by a glob of /opt/*/.venv), never a scan of the disk.
# $1 = toolkit: the toolkit's folders only (the dry run's: a clean CUDA machine).
library_folders() {
    local d
    for d in /usr/local/cuda*/lib64 /usr/local/cuda*/lib /usr/local/cuda*/targets/*/lib; do
        [ -d "$d" ] && echo "$d"
    done
    [ "${1:-}" = toolkit ] && return 0
    timeout 10 python3 -c 'import glob, nvidia
for p in nvidia.__path__:
    print("\n".join(glob.glob(p + "/*/lib")))' 2>/dev/null
    for d in /opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib; do [ -d "$d" ] && echo "$d"; done
}

# The LD_LIBRARY_PATH that resolves every binary in $1: the bundle's lib, then the first
# folder of library_folders $2 holding each missing library. Stops at once, naming what
# is unresolved. Prints the path.
resolve_libraries() {
    local bin=$1 path=$1/../lib missing name d found
    local folders
    folders=$(library_folders "${2:-}" | awk '!seen[$0]++')
    for name in $(for b in $BINARIES; do LD_LIBRARY_PATH=$path ldd $bin/$b; done |
                  awk '/not found/ { print $1 }' | sort -u); do
        found=""
        for d in $folders; do
            if [ -e "$d/$name" ]; then found=$d; break; fi
        done
        [ -n "$found" ] && case ":$path:" in *":$found:"*) ;; *) path=$path:$found ;; esac
    done
    missing=$(for b in $BINARIES; do LD_LIBRARY_PATH=$path ldd $bin/$b; done | awk '/not found/ { print $1 }' |
              sort -u | tr '\n' ' ')
    echo "libraries: LD_LIBRARY_PATH=$path (searched: $(echo $folders | tr ' ' ':'))" >>"$LOG"
    if [ -n "$missing" ]; then
        echo "unresolved: $missing" | tee -a "$LOG" >&2
        return 1
    fi
    echo "$path"
}

# Every library a binary loads comes from the bundle, from `allowed` folders, or is the
# machine's C or C++ runtime: nothing else of the build machine's may leak in.
check_origins() {
    local bin=$1 path=$2 allowed=$3 b lib bad=""
    for b in $BINARIES; do
        for lib in $(LD_LIBRARY_PATH=$path ldd $bin/$b | awk '$3 ~ /^\// { print $3 }'); do
            echo "$lib" | grep -q -E '/(libc|libm|libmvec|libdl|librt|libresolv|libpthread|libutil|ld-linux[^/]*|libstdc\+\+|libgcc_s)\.so' &&
                continue
            case "$lib" in "$bin"/../lib/*) continue ;; esac
            local ok=0 d
            for d in $allowed; do case "$lib" in "$d"/*) ok=1 ;; esac; done
            [ $ok -eq 1 ] || bad="$bad $b:$lib"
        done
    done
    [ -z "$bad" ] || { echo "from outside the bundle:$bad" | tee -a "$LOG" >&2; return 1; }
}

step_list() {
    local total=$SETUP_S s name limit
    echo "  setup (unpack, libraries): $SETUP_S s"
    for s in "${STEPS[@]}"; do
        IFS='|' read -r name limit _ <<<"$s"
        echo "  $name: ${limit} s"
        total=$((total + limit))
    done
    echo "  total: $total s (budget $BUDGET_S s)"
    [ $total -le $BUDGET_S ]
}

result() { say "$1 $2 ($3 s)"; }

# --------------------------------------------------------------------------------------------

if [ "${1:-}" = bundle ]; then
    start=$SECONDS
    if bundle; then result PASS bundle $((SECONDS - start)); ls -la "$BUNDLE"; exit 0; fi
    result FAIL bundle $((SECONDS - start)); tail -20 "$LOG"; exit 1
fi

if [ "${1:-}" = --dry-run ]; then
    NVCC=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
    if [ -z "$NVCC" ]; then say "SKIP gpu_check dry run: no nvcc here, so no CUDA build to check"; exit 0; fi
    failed=0
    start=$SECONDS
    if bundle; then result PASS bundle $((SECONDS - start)); else
        result FAIL bundle $((SECONDS - start)); tail -20 "$LOG"; exit 1
    fi
    start=$SECONDS
    tmp=$(mktemp -d /tmp/zf_bundle.XXXXXX)
    trap 'rm -rf "$tmp"' EXIT
    if tar -C "$tmp" -xJf "$BUNDLE" && [ -d "$tmp/bundle/lib" ] &&
       for b in $BINARIES; do [ -x "$tmp/bundle/bin/$b" ] || exit 1; done; then
        result PASS unpack $((SECONDS - start))
    else
        result FAIL unpack $((SECONDS - start)); exit 1
    fi
    start=$SECONDS
    carried=$(ls "$tmp/bundle/lib" | tr '\n' ' ')
    echo "bundled libraries: $carried" >>"$LOG"
    if echo " $carried" | grep -q -E ' (libc|libm|libstdc\+\+|libgcc_s|libcudart|libcublas|libnccl)[.-]'; then
        echo "bundled what the GPU machine brings: $carried" | tee -a "$LOG"
        result FAIL bundle-contents $((SECONDS - start)); failed=1
    else
        result PASS bundle-contents $((SECONDS - start))
    fi
    start=$SECONDS
    if path=$(resolve_libraries "$tmp/bundle/bin" toolkit) &&
       check_origins "$tmp/bundle/bin" "$path" "$(library_folders toolkit)"; then
        result PASS libraries $((SECONDS - start))
    else
        result FAIL libraries $((SECONDS - start)); failed=1
    fi
    start=$SECONDS
    if out=$(step_list); then echo "$out" | tee -a "$LOG"; result PASS step-budget $((SECONDS - start)); else
        echo "$out" | tee -a "$LOG"; result FAIL step-budget $((SECONDS - start)); failed=1
    fi
    [ $failed -eq 0 ] && say "gpu_check dry run: all passed" || say "gpu_check dry run: FAILED (see $LOG)"
    exit $failed
fi

# ---- on the GPU machine ----

PATH=$PATH:/usr/local/cuda/bin   # compute-sanitizer, where the image leaves it off PATH
failed=0
start=$SECONDS
if ! nvidia-smi -L >>"$LOG" 2>&1; then result FAIL gpu-visible $((SECONDS - start)); exit 1; fi
result PASS gpu-visible $((SECONDS - start))
if [ ! -f "$BUNDLE" ]; then
    say "no $BUNDLE: build it where nvcc is (tools/gpu_check.sh bundle) and carry it here"; exit 1
fi
start=$SECONDS
tmp=$(mktemp -d /tmp/zf_bundle.XXXXXX)
if ! timeout 20 tar -C "$tmp" -xJf "$BUNDLE"; then result FAIL unpack $((SECONDS - start)); exit 1; fi
BIN=$tmp/bundle/bin
if ! LIBS=$(resolve_libraries "$BIN"); then result FAIL libraries $((SECONDS - start)); exit 1; fi
result PASS libraries $((SECONDS - start))
echo "step list:" >>"$LOG"
step_list >>"$LOG"

for s in "${STEPS[@]}"; do
    IFS='|' read -r name limit command <<<"$s"
    command=${command//\$BIN/$BIN}
    echo >>"$LOG"
    echo "== $name (timeout $limit s): $command" >>"$LOG"
    start=$SECONDS
    if [ "${name%%-*}" = torch ]; then  # PyTorch keeps the machine's own libraries
        timeout -k 5 "$limit" $command >>"$LOG" 2>&1
    else
        env LD_LIBRARY_PATH="$LIBS" timeout -k 5 "$limit" $command >>"$LOG" 2>&1
    fi
    rc=$?
    took=$((SECONDS - start))
    section=$(awk -v h="== $name " 'index($0, h) == 1 { keep = 1; next } keep' "$LOG")
    if [ $rc -eq 0 ]; then  # with the step's figure, if it prints one
        figure=$(echo "$section" | grep -E 'Synthesis|ms/iter|^\| ZeRO-3 \| 8 ' | tail -1)
        say "PASS $name ($took s)${figure:+: $figure}"
    elif [ "$name" = compute-sanitizer ] &&
         echo "$section" | grep -q -E 'Device not supported|error 999'; then
        result REFUSED "$name" $took
    else
        if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then why="timed out"; else why="rc=$rc"; fi
        say "FAIL $name ($took s, $why)"
        echo "$section" | tail -15 | sed 's/^/    /'
        failed=1
    fi
done
[ $failed -eq 0 ] && say "gpu_check: all passed" || say "gpu_check: FAILED (see $LOG)"
exit $failed
