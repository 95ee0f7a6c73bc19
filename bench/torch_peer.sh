#!/usr/bin/env bash
# bench/torch_peer.sh [BIN]: the char-small step against the peer a
# user would pick today, a current PyTorch 2.x from PyPI (MKL, oneDNN) running
# nanoGPT's model (tests/torch_gpt.py bench) eager and torch.compile'd, at 1 and
# 2 threads. Its best, beside zerofiber's best char-small step (BIN/bench_cpu,
# default build/cpu/bin), both measured in this run.
#
# That PyTorch lives in the venv that make venv makes once per machine, outside
# the clone (ZF_VENV, else ~/.cache/zerofiber/venv; PyPI's Linux wheel brings
# its CUDA libraries along, about 5.6 GB). Without it, one line says how to
# enable the comparison.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=${1:-build/cpu/bin}
python=${ZF_VENV:-$HOME/.cache/zerofiber/venv}/bin/python

if [ ! -x "$python" ]; then
    echo "vs PyTorch 2.x: not set up: make venv installs it from PyPI (about 5.6 GB), make bench-torch runs it"
    exit 0
fi
[ -x "$bin/bench_cpu" ] || { echo "torch_peer.sh: no $bin/bench_cpu (make first)" >&2; exit 1; }

# ours as bin/train runs it, and with passive OpenMP waiting too (the setting
# PyTorch gets below): on a shared machine spinning workers can cost us 5x
ours=$("$bin/bench_cpu" --char-small | tee >(cat >&2) | awk '$1 == "char-small" { print $2 }')
ours_passive=$(OMP_WAIT_POLICY=PASSIVE "$bin/bench_cpu" --char-small | tee >(cat >&2) |
    awk '$1 == "char-small" { print $2 }')
echo "zerofiber char-small: ${ours} ms/iter, ${ours_passive} ms/iter with OMP_WAIT_POLICY=PASSIVE"
# passive OpenMP waiting, as for Debian's PyTorch in bench/run.sh: on two cores,
# spinning workers take the cores from the ones with work
best=$(OMP_WAIT_POLICY=PASSIVE "$python" tests/torch_gpt.py bench --preset char-small | tee >(cat >&2) |
    awk '$1 == "best:" { for (i = 2; i <= NF; i++) if ($i == "ms/iter") print $(i - 1), $3, $5, $6 }')
read -r theirs version mode threads <<<"$best"
awk -v ours="$ours" -v passive="$ours_passive" -v theirs="$theirs" \
    -v who="PyTorch $version, nanoGPT $mode, ${threads%:}" 'BEGIN {
    how = "as bin/train runs"
    if (passive < ours) { ours = passive; how = "OMP_WAIT_POLICY=PASSIVE" }
    printf "\nchar-small step: zerofiber %.1f ms (%s), %s %.1f ms: ", ours, how, who, theirs
    if (theirs >= ours) printf "%.2fx faster\n", theirs / ours
    else printf "%.2fx slower\n", ours / theirs }'
