#!/usr/bin/env bash
# make bench: the CPU presets against this machine's sgemm ceiling, then the
# char-small step against PyTorch's nanoGPT, side by side in the same run.
#
# PyTorch gets its best settings: OpenBLAS's SkylakeX kernels where the CPU has
# AVX-512 (Debian's OpenBLAS 0.3.21 otherwise falls back to generic ones),
# passive OpenMP waiting (its two thread pools fight on two cores otherwise),
# and the best thread count, which tools/torch_gpt.py searches.
set -euo pipefail
cd "$(dirname "$0")/.."

ours=$("${1:-./build/cpu/bin/bench_cpu}" | tee /dev/stderr | awk '$1 == "char-small" { print $2 }')

python=${ZF_PYTHON:-/usr/bin/python3}
if ! "$python" -c 'import torch' 2>/dev/null; then
    echo "vs PyTorch: SKIP: PyTorch is not importable by $python (install python3-torch: make deps)"
    exit 0
fi
coretype=${OPENBLAS_CORETYPE:-}
if [ -z "$coretype" ] && grep -q avx512f /proc/cpuinfo; then coretype=SkylakeX; fi
echo
theirs=$(OPENBLAS_CORETYPE=$coretype OMP_WAIT_POLICY=PASSIVE "$python" tools/torch_gpt.py bench \
    --preset char-small | tee /dev/stderr | awk '$1 == "best:" { print $6 }')
awk -v ours="$ours" -v theirs="$theirs" 'BEGIN {
    printf "\nchar-small step: zerofiber %.1f ms, PyTorch %.1f ms: %.2fx faster\n", ours, theirs, theirs / ours }'
