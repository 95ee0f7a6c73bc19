#!/usr/bin/env bash
# bench/load.sh [BIN]: the step on a quiet machine and beside a load the bench
# makes itself, two busy loops (as many as this machine's two cores; a fair
# share would make a step about twice as slow): bench/results/load.md.
#
# Two models, bin/train's char-small preset and a tiny one (2 blocks 64 wide,
# 8 x 64 tokens: many short parallel regions), each under three ways for
# OpenMP's idle threads to wait: as bin/train runs (GOMP_SPINCOUNT=3000, set by
# the program: kernels/cpu/cpu_setup.c), libgomp's default (300,000 spins, set
# by hand), and OMP_WAIT_POLICY=PASSIVE. ROUNDS rounds (ZF_LOAD_ROUNDS, default
# 3), every case once a round, in turn; each case's median ms a step over the
# steps past the 5th of its rounds, quartiles in brackets, and loaded against
# quiet.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/timing.sh

bin=${1:-build/cpu/bin}
rounds=${ZF_LOAD_ROUNDS:-3}
results=bench/results
mkdir -p $results
tmp=$(mktemp -d)
loops=()
stop_loops() { [ ${#loops[@]} -eq 0 ] || kill "${loops[@]}" 2>/dev/null || true; wait 2>/dev/null || true; loops=(); }
trap 'stop_loops; rm -rf "$tmp"' EXIT

models=(char-small tiny)
waits=("as bin/train runs" "libgomp's default" "OMP_WAIT_POLICY=PASSIVE")
flags_of() {
    case $1 in
        char-small) echo "--iters=40" ;;
        tiny) echo "--layers=2 --heads=2 --embd=64 --block=64 --batch=8 --iters=200" ;;
    esac
}
env_of() {
    case $1 in
        "as bin/train runs") echo "-u OMP_WAIT_POLICY -u GOMP_SPINCOUNT" ;;
        "libgomp's default") echo "-u OMP_WAIT_POLICY GOMP_SPINCOUNT=300000" ;;
        OMP_WAIT_POLICY=PASSIVE) echo "-u GOMP_SPINCOUNT OMP_WAIT_POLICY=PASSIVE" ;;
    esac
}

for round in $(seq 1 "$rounds"); do
    for load in quiet loaded; do
        if [ $load = loaded ]; then
            for _ in 1 2; do sh -c 'while :; do :; done' & loops+=($!); done
        fi
        for model in "${models[@]}"; do
            for w in 0 1 2; do
                # shellcheck disable=SC2046
                env $(env_of "${waits[$w]}") "$bin/train" $(flags_of $model) --log-every=1 --eval-every=0 \
                    --eval-iters=1 --sample-chars=0 | step_ms >> "$tmp/$model.$w.$load"
            done
        done
        stop_loops
    done
done

{
    echo "The step quiet and beside two busy loops (this machine: $(nproc) cores), $rounds rounds of every case"
    echo "in turn; median ms a step past the 5th of each run, quartiles in brackets"
    echo
    echo "| model | OpenMP's idle threads | quiet ms | loaded ms | loaded / quiet |"
    echo "|---|---|---|---|---|"
    for model in "${models[@]}"; do
        for w in 0 1 2; do
            read -r q qlo qhi _ < <(spread < "$tmp/$model.$w.quiet")
            read -r l llo lhi _ < <(spread < "$tmp/$model.$w.loaded")
            awk -v m="$model" -v w="${waits[$w]}" -v q=$q -v qlo=$qlo -v qhi=$qhi -v l=$l -v llo=$llo -v lhi=$lhi \
                'BEGIN { printf "| %s | %s | %s (%s-%s) | %s (%s-%s) | %.1fx |\n", m, w, q, qlo, qhi, l, llo, lhi, l / q }'
        done
    done
    echo
    echo "char-small: bin/train's default preset; tiny: $(flags_of tiny). \"as bin/train runs\": 3000 spins,"
    echo "then sleep, as the program sets it; libgomp's default: 300,000 spins (GOMP_SPINCOUNT=300000 set"
    echo "by hand, as a program that sets nothing runs)."
} | tee $results/load.md
echo "wrote $results/load.md"
