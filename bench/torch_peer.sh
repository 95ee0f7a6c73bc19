#!/usr/bin/env bash
# bench/torch_peer.sh [BIN]: the char-small step against the peer a user
# would pick today, a current PyTorch 2.x from PyPI (MKL, oneDNN) running
# nanoGPT's model (tests/torch_gpt.py bench), each side at its own best.
#
# Ours as bin/train runs it (BIN/bench_cpu --char-small, default build/cpu/bin),
# nothing set from outside; PyTorch at each of eager and torch.compile'd x 1
# and 2 threads, with its default OpenMP settings. Passive OpenMP waiting
# (OMP_WAIT_POLICY=PASSIVE) and the short spin ours sets itself
# (GOMP_SPINCOUNT=3000, kernels/cpu/cpu_setup.c) are tried too, for both sides
# alike, and printed; PyTorch's best of all is kept, and ours as a user gets it.
# ROUNDS rounds (ZF_PEER_ROUNDS, default 3), every setting once a round, in
# turn; each setting's median and its range, and the ratio of PyTorch's best
# setting to ours, round by round; last, the kernels each side ran (ours: the
# blas: line; PyTorch: its BLAS and its CPU capability), OPENBLAS_CORETYPE and
# OPENBLAS_L2_SIZE unset for both (bench/timing.sh).
#
# That PyTorch lives in the venv that make venv makes once per machine, outside
# the clone (ZF_VENV, else ~/.cache/zerofiber/venv; PyPI's Linux wheel brings
# its CUDA libraries along, about 5.6 GB). Without it, one line says how to
# enable the comparison.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/timing.sh

bin=${1:-build/cpu/bin}
python=${ZF_VENV:-$HOME/.cache/zerofiber/venv}/bin/python
rounds=${ZF_PEER_ROUNDS:-3}

if [ ! -x "$python" ]; then
    echo "vs PyTorch 2.x: not set up: make venv installs it from PyPI (about 5.6 GB), make bench-torch runs it"
    exit 0
fi
[ -x "$bin/bench_cpu" ] || { echo "torch_peer.sh: no $bin/bench_cpu (make first)" >&2; exit 1; }

times=$(mktemp) kernels=$(mktemp)
trap 'rm -f "$times" "$kernels"' EXIT
# one line a setting and round: round, setting, ms
for round in $(seq 1 "$rounds"); do
    for policy in default PASSIVE GOMP_SPINCOUNT=3000; do
        wait_env=(env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT)
        [ $policy = PASSIVE ] && wait_env=(env -u GOMP_SPINCOUNT OMP_WAIT_POLICY=PASSIVE)
        [ $policy = GOMP_SPINCOUNT=3000 ] && wait_env=(env -u OMP_WAIT_POLICY GOMP_SPINCOUNT=3000)
        "${wait_env[@]}" "$bin/bench_cpu" --char-small | tee >(cat >&2) |
            awk -v r="$round" -v p="$policy" -v k="$kernels" '$1 == "char-small" { print r, "zerofiber|OpenMP " p, $2 }
                r == 1 && p == "default" && $1 == "blas:" { print "zerofiber: " $0 >> k }' >>"$times"
        "${wait_env[@]}" "$python" tests/torch_gpt.py bench --preset char-small | tee >(cat >&2) |
            awk -v r="$round" -v p="$policy" -v k="$kernels" '$1 == "torch" && $5 ~ /^threads=/ {
                sub(":", "", $5); print r, "PyTorch " $2 " " $4 " " $5 "|OpenMP " p, $6 }
                r == 1 && p == "default" && ($1 == "torch" && $2 ~ /^BLAS_INFO=/ || $1 == "cpu") { print "PyTorch: " $0 >> k }' >>"$times"
    done
done

python3 - "$times" "$rounds" <<'PY'
import statistics, sys
rows = [line.rstrip("\n").rsplit(" ", 1) for line in open(sys.argv[1])]
times = {}  # setting -> {round: ms}
for head, ms in rows:
    rnd, setting = head.split(" ", 1)
    times.setdefault(setting, {})[int(rnd)] = float(ms)
name = lambda s: s.replace("|", ", ")
print(f"\nchar-small, ms a step: each setting's median over {sys.argv[2]} rounds [fastest-slowest]")
for setting, by_round in times.items():
    v = list(by_round.values())
    print(f"  {name(setting):52s} {statistics.median(v):7.1f} [{min(v):.1f}-{max(v):.1f}]")
ours = times["zerofiber|OpenMP default"]
best = min((s for s in times if s.startswith("PyTorch")), key=lambda s: statistics.median(times[s].values()))
ratios = [times[best][r] / ours[r] for r in sorted(ours)]
print(f"\nchar-small step: zerofiber as bin/train runs it against PyTorch at its best ({name(best)}): "
      f"{statistics.median(ratios):.2f}x (median of the rounds; " + ", ".join(f"{x:.2f}x" for x in ratios) + ")")
PY
echo
echo "kernels each side ran (OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset for both):"
sed 's/^/  /' "$kernels"
