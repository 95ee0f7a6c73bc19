#!/usr/bin/env bash
# tools/gpu_check.sh: the checks that need a GPU, as one script that fits one GPU lease
# (tools/gpu_check.md says how to run it, and what each step is for).
#
#   tools/gpu_check.sh bundle     here, on any machine with nvcc: build for sm_90 and pack the
#                                 binaries with the libraries they need into build/gpu/bundle.tar.xz
#   tools/gpu_check.sh --dry-run  here: everything that can be checked without a GPU (the bundle,
#                                 no float atomics in its kernels' code, its libraries, its binaries
#                                 starting with the toolkit hidden, and the steps' order, deadline
#                                 and skipping with every GPU step stubbed)
#   tools/gpu_check.sh            on the GPU machine (carry build/gpu/bundle.tar.xz): the steps below
#
# The GPU machine has a driver, CUDA 13, and cuBLAS(Lt) and NCCL in its toolkit or its Python venv,
# but no Criterion, Jansson or OpenBLAS, and reaches no package registry: the binaries travel
# with their libraries. cudart is linked in; cuBLAS, cuBLASLt and NCCL are loaded at their first use
# (runtime/gpu_libraries.h) from LD_LIBRARY_PATH: the bundle's lib, then the folders holding
# them, then the machine's own LD_LIBRARY_PATH, which the driver may need.
#
# The whole check runs under one deadline (DEADLINE_S from the script's start), its steps in
# order of value; a step whose timeout (and GRACE_S more) does not fit in what is left is
# skipped, and says so. Each prints one line: PASS, FAIL, REFUSED or SKIP, its seconds and its
# figure. STEPS_ONLY="name ..." runs only those (a second call). Everything lands in $OUT as it runs
# (OUT defaults to build/gpu/out): gpu_check.log (with the per-op profile of the GPT-2 steps),
# machine.txt, and the per-step losses of the GPU against the CPU (losses_*.jsonl), fewer than 8
# files. PyTorch runs in PYTHON (default: /opt/torch/.venv/bin/python where it is, else python3).
set -uo pipefail
cd "$(dirname "$0")/.."

GPU_BUILD=build/gpu
BUNDLE=$GPU_BUILD/bundle.tar.xz
BINARIES="train zero_memory test_gpu"
DEADLINE_S=${DEADLINE_S:-420}   # the whole check: a lease of 15 minutes keeps room for a short second call
GRACE_S=20                      # past a step's timeout: timeout's kill after 5 s, the GPU's state after a failure
OUT=${OUT:-$GPU_BUILD/out}
PYTHON=${PYTHON:-$( [ -x /opt/torch/.venv/bin/python ] && echo /opt/torch/.venv/bin/python || echo python3)}
mkdir -p "$OUT"
LOG=$OUT/gpu_check.log
: >"$LOG"

say() { echo "$*" | tee -a "$LOG"; }

# The GPU machine has no MPI: the bundle is built without it (MPI=0, one process).
# Libraries of ours the bundle carries: everything the binaries load, but the C library's
# family, the C++ runtime and CUDA's own (the GPU machine has newer ones).
RUNTIME_LIBS='/(libc|libm|libmvec|libdl|librt|libresolv|libpthread|libutil|ld-linux[^/]*|libstdc\+\+|libgcc_s)\.so'
NOT_BUNDLED="$RUNTIME_LIBS|/lib(cuda|cudart|cublas|cublasLt|nccl)\\.so"

# The sonames the binaries open at their first use, from the headers they were built with.
runtime_sonames() {
    local inc=${CUDA_HOME:-/usr/local/cuda}/include
    local cublas_major
    cublas_major=$(awk '/#define CUBLAS_VER_MAJOR/ { print $3 }' "$inc/cublas_api.h")
    echo "libcublas.so.$cublas_major"
    echo "libcublasLt.so.$cublas_major"
    echo "libnccl.so.$(awk '/#define NCCL_MAJOR/ { print $3 }' "$inc/nccl.h")"
}

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
    runtime_sonames >$GPU_BUILD/bundle/runtime_libraries.txt || return 1
    tar -C $GPU_BUILD -cJf "$BUNDLE" bundle && rm -rf $GPU_BUILD/bundle
}

# Folders that may hold cuBLAS(Lt) and NCCL: the CUDA toolkit's, then the Python venv's
# nvidia/*/lib (asked of python3, then by a glob of /opt/*/.venv), never a scan of the disk.
# $1 = toolkit: the toolkit's folders only.
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

# The LD_LIBRARY_PATH for the binaries in $1: the bundle's lib, then the first folder of
# library_folders $2 holding each library ldd misses or the binaries open at first use
# (the bundle's runtime_libraries.txt), then the machine's own LD_LIBRARY_PATH. Stops at
# once, naming what is unresolved. Prints the path.
resolve_libraries() {
    local bin=$1 path=$1/../lib missing name d found folders wanted
    folders=$(library_folders "${2:-}" | awk '!seen[$0]++')
    wanted=$( (for b in $BINARIES; do LD_LIBRARY_PATH=$path ldd $bin/$b; done | awk '/not found/ { print $1 }';
               cat "$bin/../runtime_libraries.txt" 2>/dev/null) | sort -u)
    missing=""
    for name in $wanted; do
        found=""
        for d in $folders; do
            if [ -e "$d/$name" ]; then found=$d; break; fi
        done
        if [ -z "$found" ]; then missing="$missing $name"; continue; fi
        case ":$path:" in *":$found:"*) ;; *) path=$path:$found ;; esac
        echo "library: $name from $found" >>"$LOG"
    done
    [ -n "${LD_LIBRARY_PATH:-}" ] && path=$path:$LD_LIBRARY_PATH
    echo "libraries: LD_LIBRARY_PATH=$path (searched: $(echo $folders | tr ' ' ':'))" >>"$LOG"
    missing="$missing $(for b in $BINARIES; do LD_LIBRARY_PATH=$path ldd $bin/$b; done | awk '/not found/ { print $1 }' |
                        sort -u | tr '\n' ' ')"
    echo "$path"
    if [ -n "${missing// /}" ]; then
        echo "unresolved:$missing" | tee -a "$LOG" >&2
        return 1
    fi
}

# Every library a binary loads comes from the bundle, from `allowed` folders, or is the
# machine's C or C++ runtime: nothing else of the build machine's may leak in.
check_origins() {
    local bin=$1 path=$2 allowed=$3 b lib bad=""
    for b in $BINARIES; do
        for lib in $(LD_LIBRARY_PATH=$path ldd $bin/$b | awk '$3 ~ /^\// { print $3 }'); do
            echo "$lib" | grep -q -E "$RUNTIME_LIBS" && continue
            case "$lib" in "$bin"/../lib/*) continue ;; esac
            local ok=0 d
            for d in $allowed; do case "$lib" in "$d"/*) ok=1 ;; esac; done
            [ $ok -eq 1 ] || bad="$bad $b:$lib"
        done
    done
    [ -z "$bad" ] || { echo "from outside the bundle:$bad" | tee -a "$LOG" >&2; return 1; }
}

# ---- the kernels' code, without a GPU ------------------------------------------------------

# cuobjdump: on PATH, the toolkit's, else the one Triton brings into a PyTorch venv (make
# venv's, ZF_VENV) or NVIDIA's wheel of it. Prints its path.
find_cuobjdump() {
    local venv=${ZF_VENV:-$HOME/.cache/zerofiber/venv} c
    for c in "$(command -v cuobjdump)" "${CUDA_HOME:-/usr/local/cuda}/bin/cuobjdump" \
             "$venv"/lib/python3*/site-packages/triton/backends/nvidia/bin/cuobjdump \
             "$venv"/lib/python3*/site-packages/nvidia/cu*/bin/cuobjdump; do
        [ -x "$c" ] && { echo "$c"; return 0; }
    done
    return 1
}

# A float atomic makes the order of a sum, and so its bits, the scheduler's: none may be in our
# kernels. In the SASS, float reductions and atomics (RED, REDG, ATOM, ATOMG, ATOMS on F16x2,
# BF16x2, F32 or F64: REDG.E.ADD.F32.FTZ.RN.STRONG.GPU) and the compiler's compare-and-swap loop
# for a float add in shared memory (ATOMS.CAST.SPIN); in the PTX, every atom or red on a float
# type, which also finds the scalar half and bf16 adds the SASS makes compare-and-swap loops of.
FLOAT_SASS='\b(RED|REDG|ATOM|ATOMG|ATOMS)\.[A-Za-z0-9.]*\b(F16|F16x2|BF16|BF16x2|F32|F64)\b|\bATOMS\.CAST\.SPIN'
FLOAT_PTX='\b(atom|red)(\.[a-z0-9_]+)*\.(f16|f16x2|bf16|bf16x2|f32|f64)\b'

# Every float atomic in the objects the bundle's build made of our .cu files, one line each
# ("file: instruction"); $1 = cuobjdump. Fails when an object is missing.
float_atomics() {
    local f obj
    for f in runtime/*.cu kernels/cuda/*.cu; do
        obj=$GPU_BUILD/${f%.cu}.o
        [ -f "$obj" ] || { echo "$f: no $obj"; return 1; }
        { "$1" -sass "$obj" && "$1" -ptx "$obj"; } >"$tmp/code.txt" || { echo "$f: cuobjdump failed"; return 1; }
        grep -o -E "($FLOAT_SASS|$FLOAT_PTX)[^;]*" "$tmp/code.txt" | sort -u | sed "s|^|$f: |"
    done
    return 0
}

# Instructions promised in kernels: "object arch kernel" for each of the kernels whose SASS for
# arch holds none matching the pattern (an awk regular expression; a kernel by its mangled
# name's length and name, as _Z15residual_kernel...); $1 = cuobjdump, $2 the object,
# $3 the pattern, $4 the kernels, then the archs (the bundle's sm_90; the Makefile's default
# build, where it is, sm_80 and sm_90). Fails when the object is missing.
missing_instruction() {
    local dump=$1 obj=$2 pattern=$3 kernels=$4 arch kernel
    shift 4
    [ -f "$obj" ] || { echo "no $obj"; return 1; }
    "$dump" -sass "$obj" >"$tmp/code.sass" || { echo "$obj: cuobjdump failed"; return 1; }
    for arch in "$@"; do
        for kernel in $kernels; do
            PATTERN=$pattern awk -v arch="$arch" -v kernel="$kernel" '
                /code for sm_/ { here = ($NF == arch) }
                /Function :/ { fn = $NF }
                here && index(fn, length(kernel) kernel) && $0 ~ ENVIRON["PATTERN"] { found = 1 }
                END { exit !found }' "$tmp/code.sass" || echo "$obj $arch $kernel: no $pattern"
        done
    done
    return 0
}

# What the kernels promise, for one build ($1 = cuobjdump, $2 the build's folder, then its
# archs): the attention's three flash kernels bf16 tensor-core mma (HMMA.16816.F32.BF16), and
# the kernels that take a pack of numbers a thread (kernels/packs.h: the elementwise ones, the
# conversions, AdamW) 16-byte loads and stores.
missing_promised() {
    local dump=$1 build=$2 promise object pattern kernels
    shift 2
    local packed="gelu_forward_kernel gelu_backward_kernel residual_kernel bias_forward_kernel dropout_kernel"
    for promise in "attention|HMMA[.]16816[.]F32[.]BF16|flash_forward_kernel flash_dkdv_kernel flash_dq_kernel" \
                   "elementwise|LDG[.]E[.]128|$packed" "elementwise|STG[.]E[.]128|$packed" \
                   "precision|LDG[.]E[.]128|convert_kernel" "precision|STG[.]E[.]128|convert_kernel" \
                   "optimizer|LDG[.]E[.]128|adamw_kernel" "optimizer|STG[.]E[.]128|adamw_kernel"; do
        IFS='|' read -r object pattern kernels <<<"$promise"
        missing_instruction "$dump" "$build/kernels/cuda/$object.o" "$pattern" "$kernels" "$@" || return 1
    done
    return 0
}

# The kernels' code as the bundle's build made it. Spills and local memory fail that build
# itself (the Makefile's ptxas -warn-spills,-warn-lmem-usage,-Werror); float atomics here.
check_kernel_code() {
    local start=$SECONDS dump found objects
    if ! grep -q -- '-Xptxas -warn-spills,-warn-lmem-usage,-Werror' Makefile; then
        say "FAIL kernel-code (0 s): the Makefile's nvcc flags no longer make spills and local memory errors"
        return 1
    fi
    if ! dump=$(find_cuobjdump); then
        say "SKIP kernel-code: no cuobjdump (the toolkit's, or Triton's in a PyTorch venv: make venv)"
        return 0
    fi
    found=$(float_atomics "$dump") || { say "FAIL kernel-code ($((SECONDS - start)) s): $found"; return 1; }
    objects=$(ls runtime/*.cu kernels/cuda/*.cu | wc -l)
    if [ -n "$found" ]; then
        say "FAIL kernel-code ($((SECONDS - start)) s): float atomics in the SASS or PTX:"
        echo "$found" | sed 's/^/    /' | tee -a "$LOG"
        return 1
    fi
    local archs="sm_90 (the bundle's)" default_build=build/cuda
    found=$(missing_promised "$dump" "$GPU_BUILD" sm_90) || {
        say "FAIL kernel-code ($((SECONDS - start)) s): $found"
        return 1
    }
    if [ -f "$default_build/kernels/cuda/attention.o" ]; then
        found+=$'\n'$(missing_promised "$dump" "$default_build" sm_80 sm_90) || {
            say "FAIL kernel-code ($((SECONDS - start)) s): $found"
            return 1
        }
        archs="sm_80 and sm_90 (make's build) and sm_90 (the bundle's)"
    fi
    if [ -n "$(echo "$found" | tr -d '[:space:]')" ]; then
        say "FAIL kernel-code ($((SECONDS - start)) s): an instruction promised is missing (object arch kernel):"
        echo "$found" | sed '/^$/d; s/^/    /' | tee -a "$LOG"
        return 1
    fi
    say "PASS kernel-code ($((SECONDS - start)) s): no spills or local memory (ptxas, as errors), no float atomics" \
        "in the SASS or PTX of $objects objects, bf16 mma.sync in the attention's three kernels and 16-byte" \
        "loads and stores in the seven packed ones for $archs"
}

# ---- the steps ----------------------------------------------------------------------------

# The steps, in order of value: name, timeout in seconds, command (run from the repository
# root: $BIN the binaries, $PYTHON PyTorch's Python, $OUT the output folder; a command that
# begins with a function of this script runs that function). Their timeouts sum past the
# deadline on purpose: the last ones run only when the first ones were quick. First GPT-2
# 124M's step, ours beside PyTorch's eager one, then determinism at its shape and test_gpu;
# PyTorch's compiled step later: PyTorch's figures do not change with our code.
SMALL="--layers=2 --embd=64 --heads=4 --block=64 --batch=4 --eval-every=0 --eval-iters=1 --sample-chars=8"
CHAR="--preset=char --device=cuda --eval-every=0 --eval-iters=0 --sample-chars=0 --log-every=20"
STEPS=(
    "preflight|30|preflight"
    "gpt2-bf16|50|gpt2_step bf16"
    "gpt2-tf32|50|gpt2_step tf32"
    "torch-gpt2-eager|75|torch_gpt2 eager"
    "determinism-gpt2|100|determinism_gpt2"
    "gpt2-bf16-graphs|50|gpt2_step graphs"
    "gpu-tests|90|env NCCL_DEBUG=WARN ZF_REQUIRE_GPU=1 \$BIN/test_gpu --jobs 1 --filter gpu/*"
    "gpt2-xl-memory|90|xl_memory"
    "torch-gpt2-compiled|150|torch_gpt2 compiled"
    "smoke|25|\$BIN/train --device=cuda $SMALL --iters=3"
    "char-fp32|45|\$BIN/train $CHAR --zero=0 --gpus=1 --iters=60"
    "char-fp32-graphs|45|\$BIN/train $CHAR --zero=0 --gpus=1 --iters=60 --graphs=1"
    "torch-eager|60|\$PYTHON tests/torch_gpt.py bench --preset char --device cuda --iters 40 --modes eager"
    "char-tf32|30|\$BIN/train $CHAR --zero=0 --gpus=1 --iters=60 --tf32=1"
    "torch-eager-tf32|45|\$PYTHON tests/torch_gpt.py bench --preset char --device cuda --iters 40 --modes eager --tf32"
    "gpu-vs-cpu|45|losses_against_the_cpu"
    "gpu-nccl-tests|45|env NCCL_DEBUG=WARN ZF_REQUIRE_GPU=1 \$BIN/test_gpu --jobs 1 --filter gpu_nccl/*"
    "gpu-process-tests|45|env NCCL_DEBUG=WARN ZF_REQUIRE_GPU=1 \$BIN/test_gpu --jobs 1 --filter gpu_processes/*"
    "char-zero3-4sim|45|\$BIN/train $CHAR --zero=3 --gpus=4 --batch=16 --iters=40"
    "char-zero3-4sim-bf16|45|\$BIN/train $CHAR --zero=3 --gpus=4 --batch=16 --iters=40 --dtype=bf16 --reduce-dtype=bf16"
    "zero-memory-cuda|30|\$BIN/zero_memory --device=cuda"
    "torch-compiled|100|\$PYTHON tests/torch_gpt.py bench --preset char --device cuda --iters 40 --modes compiled"
    "compute-sanitizer|75|compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 \$BIN/train --device=cuda --zero=3 --gpus=2 $SMALL --iters=2 --dropout=0.1"
)

# What the machine is, into $OUT/machine.txt: each question bounded, none of them fatal.
preflight() {
    local m=$OUT/machine.txt
    {
        echo "== date"; date -u
        echo "== driver (ldconfig -p)"; timeout 10 ldconfig -p | grep -E 'libcuda\.so|libnvidia-ml\.so'
        echo "== nvidia-smi"; timeout 15 nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
        timeout 15 nvidia-smi -L
        echo "== LD_LIBRARY_PATH"; echo "${LIBS:-}"
        echo "== libraries the binaries open"; cat "$BIN/../runtime_libraries.txt"
        echo "== cpu"; nproc; grep -m1 'model name' /proc/cpuinfo
        grep -o -w -E 'avx2|avx512f|avx512_bf16|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' '; echo
        echo "== memory"; grep -E 'MemTotal|MemAvailable' /proc/meminfo
        echo "== /dev/shm"; timeout 5 df -h /dev/shm
        echo "== network"; timeout 5 ip -br addr 2>/dev/null || cat /proc/net/dev
        echo "== python"; timeout 30 python3 -c 'import sys, torch
print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      "nccl", ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else "no GPU to torch")'
    } >"$m" 2>&1
    cat "$m"
    grep -q -E '^GPU [0-9]+:' "$m"   # the figure: nvidia-smi found a GPU
}

# The same init, batches and dropout masks trained on the GPU and on the CPU, one rank and
# ZeRO-3 on 2 simulated ranks: each step's loss into $OUT, and the largest relative
# difference over the steps. GPU math rounds otherwise than the CPU's: it must stay within
# LOSS_TOL, not match.
LOSS_TOL=1e-3
losses_against_the_cpu() {
    local flags="--layers=4 --embd=128 --heads=4 --block=64 --batch=8 --iters=20 --log-every=1 --eval-every=0"
    flags="$flags --eval-iters=1 --sample-chars=0 --dropout=0.1 --lr=1e-3 --warmup=2"
    local name split device
    for split in "one|--zero=0 --gpus=1" "zero3|--zero=3 --gpus=2"; do
        name=${split%%|*}
        for device in cuda cpu; do
            env LD_LIBRARY_PATH="$LIBS" timeout -k 5 20 $BIN/train $flags ${split#*|} --device=$device \
                --log="$OUT/losses_${name}_$device.jsonl" >/dev/null || return 1
        done
    done
    python3 - "$OUT" "$LOSS_TOL" <<'EOF'
import json, sys
out, tol = sys.argv[1], float(sys.argv[2])
worst = 0.0
for name in ("one", "zero3"):
    losses = {}
    for device in ("cuda", "cpu"):
        with open(f"{out}/losses_{name}_{device}.jsonl") as f:
            losses[device] = [json.loads(l)["loss"] for l in f if '"loss"' in l]
    if len(losses["cuda"]) != len(losses["cpu"]) or not losses["cpu"]:
        sys.exit(f"{name}: {len(losses['cuda'])} steps on the GPU, {len(losses['cpu'])} on the CPU")
    diff = max(abs(g - c) / abs(c) for g, c in zip(losses["cuda"], losses["cpu"]))
    print(f"losses, GPU against CPU, {name}: {len(losses['cpu'])} steps, largest relative difference {diff:.2e}")
    worst = max(worst, diff)
print(f"largest relative difference of a step's loss: {worst:.2e} (tolerance {tol:g})")
sys.exit(0 if worst <= tol else 1)
EOF
}

# Random GPT-2 ids (tests/random_gpt2_ids.py, as bench/gpt2.sh makes them) in $GPT2_IDS, made
# by the first step that needs them: speed and memory, not learning, are measured.
gpt2_ids() {
    [ -f "$GPT2_IDS/train.bin" ] || python3 tests/random_gpt2_ids.py "$GPT2_IDS" 200000 20000
}

# From bin/train's output with --log-every=1 (each iter line one step's ms): the median ms of
# the last 10 steps, tokens/s at 12 x 1024 a step, and the peak memory of a rank.
step_figures() {
    local out=$1 name=$2 ms peak
    ms=$(echo "$out" | sed -n 's/^iter [0-9]*: .*, \([0-9.]*\) ms\/iter,.*/\1/p' | tail -10 | sort -n |
         awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }')
    peak=$(echo "$out" | sed -n 's/^peak memory of a rank: \([0-9.]*\) MB.*/\1/p')
    [ -n "$ms" ] || { echo "$name: no iter lines"; return 1; }
    awk -v name="$name" -v ms="$ms" -v peak="${peak:-?}" 'BEGIN {
        printf "figure: %s: %.1f ms/iter (median of the last 10 of 15), %.0f tok/s, peak memory %s MB\n",
               name, ms, 12 * 1024 * 1000 / ms, peak }'
}

# GPT-2 124M (--preset=gpt2) on one GPU, batch 12 x 1024, 15 steps, with the per-op profile
# (ZF_PROFILE=1): $1 = bf16 (--dtype=bf16), tf32 (fp32 with --tf32=1), or graphs (bf16 with
# --graphs=1, each step one graph's launch from the third on; no profile, which graphs refuse).
gpt2_step() {
    local flags="--preset=gpt2 --device=cuda --batch=12 --grad-accum=1 --iters=15 --log-every=1 --eval-every=0"
    flags="$flags --eval-iters=0 --sample-chars=0 --data=$GPT2_IDS"
    local profile=1
    case $1 in
        bf16) flags="$flags --dtype=bf16" ;;
        tf32) flags="$flags --tf32=1" ;;
        graphs) flags="$flags --dtype=bf16 --graphs=1"; profile= ;;
    esac
    gpt2_ids || return 1
    local out rc
    out=$(env LD_LIBRARY_PATH="$LIBS" ZF_PROFILE=$profile $BIN/train $flags 2>&1)
    rc=$?
    echo "$out"
    [ $rc -eq 0 ] || return $rc
    step_figures "$out" "gpt2 $1"
}

# GPT-2 XL under ZeRO-3 on 8 ranks simulated on the GPU, one row of 1024 a rank, in bf16
# reduced in bf16 with --recompute=1 and one live unit (issue 46's "under 4 GB": 3953 MB a rank
# by count), 2 steps: the allocator's peak of a rank and CUDA's of the device (every rank's,
# the context and the libraries' own included).
xl_memory() {
    local flags="--preset=gpt2-xl --device=cuda --zero=3 --gpus=8 --batch=1 --grad-accum=1 --iters=2"
    flags="$flags --dtype=bf16 --reduce-dtype=bf16 --recompute=1 --max-live-units=1 --log-every=1"
    flags="$flags --eval-every=0 --eval-iters=0 --sample-chars=0 --data=$GPT2_IDS"
    gpt2_ids || return 1
    local out rc used peak
    out=$(env LD_LIBRARY_PATH="$LIBS" $BIN/train $flags 2>&1 & pid=$!
          used=0
          while kill -0 $pid 2>/dev/null; do
              now=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1)
              [ -n "$now" ] && [ "$now" -gt "$used" ] && used=$now
              sleep 0.5
          done
          wait $pid; rc=$?
          echo "device memory used at most: $used MiB (nvidia-smi, every 0.5 s)"
          exit $rc)
    rc=$?
    echo "$out"
    [ $rc -eq 0 ] || return $rc
    peak=$(echo "$out" | sed -n 's/^peak memory of a rank: \([0-9.]*\) MB.*/\1/p')
    used=$(echo "$out" | sed -n 's/^device memory used at most: \([0-9]*\) MiB.*/\1/p')
    echo "figure: gpt2-xl zero3 8 ranks, recompute, K=1: peak memory of a rank ${peak:-?} MB (3953 MB by" \
         "count), the device ${used:-?} MiB for all 8"
}

# nanoGPT's model in PyTorch on the same GPU and ids, batch 12 x 1024, fused AdamW; $1 = eager
# or compiled: bf16 autocast with flash attention, and (eager) fp32 with TF32 as well.
torch_gpt2() {
    gpt2_ids || return 1
    local bench="tests/torch_gpt.py bench --preset gpt2 --data $GPT2_IDS --device cuda --batch 12 --iters 10 --fused"
    local figure="figure: torch $1" setting out
    for setting in "bf16 autocast|--autocast" "fp32 TF32|--tf32"; do
        [ "$1" = eager ] || [ "${setting%%|*}" = "bf16 autocast" ] || continue
        out=$("$PYTHON" $bench --modes "$1" ${setting#*|} 2>&1) || { echo "$out"; return 1; }
        echo "$out"
        figure="$figure, ${setting%%|*} $(echo "$out" | sed -n 's/^best: .*: \([0-9.]*\) ms\/iter.*/\1/p') ms/iter"
    done
    echo "$figure"
}

# At GPT-2's shape in bf16, 3 steps: two runs on one GPU write the same checkpoint, byte for
# byte, and so does a third with --graphs=1 (its last step a graph's launch); and DDP, ZeRO-2
# and ZeRO-3 on 2 ranks simulated on it write one checkpoint.
determinism_gpt2() {
    local flags="--preset=gpt2 --device=cuda --dtype=bf16 --grad-accum=1 --iters=3 --log-every=1 --eval-every=0"
    flags="$flags --eval-iters=0 --sample-chars=0 --data=$GPT2_IDS"
    local dir=$GPT2_IDS.checkpoints run name
    gpt2_ids && mkdir -p "$dir" || return 1
    for run in "one|--gpus=1 --batch=4" "again|--gpus=1 --batch=4" "graphs|--gpus=1 --batch=4 --graphs=1" \
               "ddp|--zero=0 --gpus=2 --batch=2" \
               "zero2|--zero=2 --gpus=2 --batch=2" "zero3|--zero=3 --gpus=2 --batch=2"; do
        name=${run%%|*}
        echo "-- $name: ${run#*|}"
        env LD_LIBRARY_PATH="$LIBS" $BIN/train $flags ${run#*|} --out="$dir/$name" || return 1
    done
    local bad=0
    for pair in "one again" "one graphs" "ddp zero2" "ddp zero3"; do
        set -- $pair
        cmp "$dir/$1/ckpt.safetensors" "$dir/$2/ckpt.safetensors" || bad=1
    done
    local mb=$(( $(stat -c %s "$dir/one/ckpt.safetensors") / 1000000 ))
    rm -rf "$dir"
    [ $bad -eq 0 ] || { echo "figure: determinism at GPT-2's shape: checkpoints differ"; return 1; }
    echo "figure: determinism at GPT-2's shape: two runs, one with graphs, and DDP, ZeRO-2, ZeRO-3 on 2 ranks, the" \
         "same bytes ($mb MB)"
}

# Seconds since the script began; in a stub run, the whole timeouts of the steps run so far,
# added up (a clock of its own: the real seconds between steps would move the edge by one).
elapsed() { if [ -n "$STUB_CLOCK" ]; then echo "$STUB_CLOCK"; else echo "$SECONDS"; fi; }

# Run the steps in order under the deadline. $1 = stub: every command replaced by an echo,
# and every step counted as taking its whole timeout (the worst case), so that the deadline
# and the skipping run as they would on the GPU.
run_steps() {
    local stub=${1:-} s name limit command left start took rc section figure why
    STUB_CLOCK=
    [ -n "$stub" ] && STUB_CLOCK=0  # a stub run starts its clock at its first step
    for s in "${STEPS[@]}"; do
        IFS='|' read -r name limit command <<<"$s"
        case " ${ONLY:-$name} " in *" $name "*) ;; *) continue ;; esac
        left=$((DEADLINE_S - $(elapsed)))
        if [ $((limit + GRACE_S)) -gt "$left" ]; then
            say "SKIP $name (needs up to $((limit + GRACE_S)) s, $left s of the $DEADLINE_S s deadline left)"
            continue
        fi
        command=${command//\$BIN/$BIN}
        command=${command//\$PYTHON/$PYTHON}
        [ -n "$stub" ] && command="echo stub: $name"
        echo >>"$LOG"
        echo "== $name (timeout $limit s): $command" >>"$LOG"
        start=$SECONDS
        set -f  # a command's words are its own: --filter gpu/* is Criterion's pattern, not the shell's
        if declare -F "${command%% *}" >/dev/null; then
            timeout_function "$limit" $command >>"$LOG" 2>&1
        elif [ "${command%% *}" = "$PYTHON" ]; then
            timeout -k 5 "$limit" $command >>"$LOG" 2>&1  # PyTorch keeps the machine's libraries
        else
            env LD_LIBRARY_PATH="$LIBS" timeout -k 5 "$limit" $command >>"$LOG" 2>&1
        fi
        rc=$?
        set +f
        took=$((SECONDS - start))
        [ -n "$stub" ] && STUB_CLOCK=$((STUB_CLOCK + limit + GRACE_S))
        section=$(awk -v h="== $name " 'index($0, h) == 1 { keep = 1; next } keep' "$LOG")
        figure=$(echo "$section" | grep -E 'Synthesis|ms/iter|largest relative|^GPU 0:|^\| ZeRO-3 \| 8 |^stub:|^figure:' |
                 tail -1)
        if [ $rc -eq 0 ]; then
            say "PASS $name ($took s)${figure:+: $figure}"
        elif [ "$name" = compute-sanitizer ] && echo "$section" | grep -q -E 'Device not supported|error 999'; then
            say "REFUSED $name ($took s): the runtime keeps compute-sanitizer from the device"
        else
            if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then why="timed out"; else why="rc=$rc"; fi
            say "FAIL $name ($took s, $why)${figure:+: $figure}"
            echo "$section" | tail -15 | sed 's/^/    /' | tee -a "$LOG"
            # the machine as the failure left it
            [ -z "$stub" ] && { echo "== the GPU after $name failed"; timeout 15 nvidia-smi; } >>"$LOG" 2>&1
            FAILED=1
        fi
    done
}

# A function of this script ($2, its arguments after it) under a timeout: in a child shell of a
# process group of its own (job control), killed whole past it (124), whatever it started.
timeout_function() {
    local limit=$1 until=$((SECONDS + $1))
    shift
    set -m
    ( "$@" ) &
    local pid=$!
    set +m
    while kill -0 $pid 2>/dev/null; do
        if [ $SECONDS -ge $until ]; then kill -9 -- -$pid 2>/dev/null; wait $pid 2>/dev/null; return 124; fi
        sleep 0.1
    done
    wait $pid
}

# --------------------------------------------------------------------------------------------

if [ "${1:-}" = bundle ]; then
    start=$SECONDS
    if bundle; then say "PASS bundle ($((SECONDS - start)) s)"; ls -la "$BUNDLE"; exit 0; fi
    say "FAIL bundle ($((SECONDS - start)) s)"; tail -20 "$LOG"; exit 1
fi

FAILED=0

if [ "${1:-}" = --dry-run ]; then
    NVCC=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
    if [ -z "$NVCC" ]; then say "SKIP gpu_check dry run: no nvcc here, so no CUDA build to check"; exit 0; fi
    start=$SECONDS
    if bundle; then say "PASS bundle ($((SECONDS - start)) s)"; else
        say "FAIL bundle ($((SECONDS - start)) s)"; tail -20 "$LOG"; exit 1
    fi
    start=$SECONDS
    tmp=$(mktemp -d /tmp/zf_bundle.XXXXXX)
    trap 'rm -rf "$tmp"' EXIT
    if tar -C "$tmp" -xJf "$BUNDLE" && [ -d "$tmp/bundle/lib" ] && [ -s "$tmp/bundle/runtime_libraries.txt" ] &&
       for b in $BINARIES; do [ -x "$tmp/bundle/bin/$b" ] || exit 1; done; then
        say "PASS unpack ($((SECONDS - start)) s)"
    else
        say "FAIL unpack ($((SECONDS - start)) s)"; exit 1
    fi
    check_kernel_code || FAILED=1
    BIN=$tmp/bundle/bin
    GPT2_IDS=$tmp/gpt2_ids
    start=$SECONDS
    carried=$(ls "$tmp/bundle/lib" | tr '\n' ' ')
    echo "bundled libraries: $carried" >>"$LOG"
    if echo " $carried" | grep -q -E ' (libc|libm|libstdc\+\+|libgcc_s|libcudart|libcublas|libnccl)[.-]'; then
        say "FAIL bundle-contents ($((SECONDS - start)) s): it carries what the GPU machine brings: $carried"
        FAILED=1
    else
        say "PASS bundle-contents ($((SECONDS - start)) s)"
    fi
    # Every library resolved against the bundle and the toolkit, the machine's own path kept
    # last (a driver found only through it), and cuBLAS(Lt) and NCCL not needed to start.
    start=$SECONDS
    if LIBS=$(LD_LIBRARY_PATH=/the/machine/own/lib resolve_libraries "$BIN" toolkit) &&
       check_origins "$BIN" "$LIBS" "$(library_folders toolkit)" && [ "${LIBS##*:}" = /the/machine/own/lib ] &&
       ! for b in $BINARIES; do ldd "$BIN/$b"; done | grep -q -E 'lib(cublas|nccl)'; then
        say "PASS libraries ($((SECONDS - start)) s): cuBLAS, cuBLASLt and NCCL opened at first use"
    else
        say "FAIL libraries ($((SECONDS - start)) s): LD_LIBRARY_PATH=${LIBS:-}"; FAILED=1
    fi
    # A machine with a driver and no toolkit, as near as this one comes: the toolkit's folders
    # hidden from the loader (empty folders mounted over them, in a mount namespace of its own),
    # and no GPU. Every binary must start and say "no GPU" in one line, never miss a library.
    start=$SECONDS
    hide=""
    for d in $(library_folders toolkit); do hide="$hide mount --bind $tmp/empty $d &&"; done
    mkdir -p "$tmp/empty"
    hidden=$(unshare -m sh -c "$hide env LD_LIBRARY_PATH=$BIN/../lib $BIN/train --device=cuda --iters=1 2>&1;
             echo rc=\$?; env LD_LIBRARY_PATH=$BIN/../lib $BIN/zero_memory --device=cuda 2>&1; echo rc=\$?" 2>&1)
    echo "$hidden" >>"$LOG"
    if [ "$(echo "$hidden" | grep -c 'no GPU is visible (no CUDA driver (libcuda.so.1: ')" -eq 2 ] &&
       [ "$(echo "$hidden" | grep -c '^rc=2$')" -eq 2 ] && ! echo "$hidden" | grep -q 'error while loading shared libraries'; then
        say "PASS starts-without-toolkit ($((SECONDS - start)) s): $(echo "$hidden" | grep -m1 'no GPU is visible')"
    else
        say "FAIL starts-without-toolkit ($((SECONDS - start)) s): $(echo "$hidden" | head -3 | tr '\n' ' ')"
        FAILED=1
    fi
    # The steps as they will run, stubbed, each taking its whole timeout: the order, the
    # deadline and the skipping.
    say "steps, stubbed, each as if it took its whole timeout ($DEADLINE_S s deadline):"
    run_steps stub
    # in the order of the table, each once; the headline figures (GPT-2's step, ours and
    # PyTorch's, and its determinism) within the deadline even then, PyTorch's eager steps
    # before their cold compiles, compute-sanitizer last
    order=$(awk '/^steps, stubbed/ { on = 1; next } on && /^(PASS|SKIP|FAIL) / { print $2 }' "$LOG" | tr '\n' ' ')
    table=$(for s in "${STEPS[@]}"; do echo "${s%%|*}"; done | tr '\n' ' ')
    headline=1
    for name in gpt2-bf16 gpt2-tf32 torch-gpt2-eager determinism-gpt2; do
        grep -q "^PASS $name " "$LOG" || headline=0
    done
    if [ "$order" = "$table" ] && grep -q '^SKIP ' "$LOG" && [ $headline -eq 1 ] &&
       [ "$(echo $table | awk '{ print $1, $2 }')" = "preflight gpt2-bf16" ] &&
       [ "$(echo $table | awk '{ print $NF }')" = compute-sanitizer ] &&
       [ "$(echo " $table" | sed 's/ torch-compiled .*//' | grep -c ' torch-eager ')" -eq 1 ] &&
       [ "$(echo " $table" | sed 's/ torch-gpt2-compiled .*//' | grep -c ' torch-gpt2-eager ')" -eq 1 ]; then
        say "PASS step-order ($(grep -c '^SKIP ' "$LOG") of ${#STEPS[@]} steps past the deadline in the worst case)"
    else
        say "FAIL step-order"; FAILED=1
    fi
    [ $FAILED -eq 0 ] && say "gpu_check dry run: all passed" || say "gpu_check dry run: FAILED (see $LOG)"
    exit $FAILED
fi

# ---- on the GPU machine ----

PATH=$PATH:/usr/local/cuda/bin   # compute-sanitizer, where the image leaves it off PATH
if [ ! -f "$BUNDLE" ]; then
    say "no $BUNDLE: build it where nvcc is (tools/gpu_check.sh bundle) and carry it here"; exit 1
fi
start=$SECONDS
tmp=$(mktemp -d /tmp/zf_bundle.XXXXXX)
if ! timeout 20 tar -C "$tmp" -xJf "$BUNDLE"; then say "FAIL unpack ($((SECONDS - start)) s)"; exit 1; fi
BIN=$tmp/bundle/bin
GPT2_IDS=$tmp/gpt2_ids
# a library missing fails the steps that need it, each with its line; the others still run
if LIBS=$(resolve_libraries "$BIN"); then say "PASS libraries ($((SECONDS - start)) s): LD_LIBRARY_PATH=$LIBS"
else say "FAIL libraries ($((SECONDS - start)) s): LD_LIBRARY_PATH=$LIBS; the steps run anyway"; FAILED=1; fi
ONLY=${STEPS_ONLY:-}
run_steps
[ $FAILED -eq 0 ] && say "gpu_check: all passed" || say "gpu_check: FAILED (see $LOG)"
exit $FAILED
