#!/usr/bin/env bash
# bench/load.sh [BIN]: the step on a quiet machine and beside a load the bench
# makes itself: one busy loop, then two (as many as this machine's two cores;
# a fair share would make a step about twice as slow): bench/results/load.md.
#
# Two models, bin/train's char-small preset and a tiny one (2 blocks 64 wide,
# 8 x 64 tokens: many short parallel regions), each in four settings: as
# bin/train runs (idle threads spin 3000 times, set by the program:
# kernels/cpu/cpu_setup.c; a stream's team one thread while a load leaves a
# core free: runtime/device_cpu.c), its teams kept whole (OMP_DYNAMIC=false),
# libgomp's default spins (300,000, set by hand), and OMP_WAIT_POLICY=PASSIVE.
# ROUNDS rounds (ZF_LOAD_ROUNDS, default 3), every case once a round, in turn;
# each case's median ms a step over the steps past the 5th of its rounds,
# quartiles in brackets, and loaded against quiet.
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
settings=("as bin/train runs" "teams kept whole" "libgomp's default spins" "OMP_WAIT_POLICY=PASSIVE")
flags_of() {
    case $1 in
        char-small) echo "--iters=40" ;;
        tiny) echo "--layers=2 --heads=2 --embd=64 --block=64 --batch=8 --iters=200" ;;
    esac
}
env_of() {
    case $1 in
        "as bin/train runs") echo "-u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u OMP_DYNAMIC" ;;
        "teams kept whole") echo "-u OMP_WAIT_POLICY -u GOMP_SPINCOUNT OMP_DYNAMIC=false" ;;
        "libgomp's default spins") echo "-u OMP_WAIT_POLICY -u OMP_DYNAMIC GOMP_SPINCOUNT=300000" ;;
        OMP_WAIT_POLICY=PASSIVE) echo "-u GOMP_SPINCOUNT -u OMP_DYNAMIC OMP_WAIT_POLICY=PASSIVE" ;;
    esac
}

for round in $(seq 1 "$rounds"); do
    for loops_beside in 0 1 2; do
        for _ in $(seq 1 $loops_beside); do sh -c 'while :; do :; done' & loops+=($!); done
        for model in "${models[@]}"; do
            for k in "${!settings[@]}"; do
                # shellcheck disable=SC2046
                env $(env_of "${settings[$k]}") "$bin/train" $(flags_of $model) --log-every=1 --eval-every=0 \
                    --eval-iters=1 --sample-chars=0 | step_ms >> "$tmp/$model.$k.$loops_beside"
            done
        done
        stop_loops
    done
done

{
    echo "The step quiet and beside one and two busy loops (this machine: $(nproc) cores), $rounds rounds of every"
    echo "case in turn; median ms a step past the 5th of each run, quartiles in brackets"
    echo
    echo "| model | setting | quiet ms | one loop, ms | two loops, ms | one / quiet | two / quiet |"
    echo "|---|---|---|---|---|---|---|"
    for model in "${models[@]}"; do
        for k in "${!settings[@]}"; do
            read -r q qlo qhi _ < <(spread < "$tmp/$model.$k.0")
            read -r a alo ahi _ < <(spread < "$tmp/$model.$k.1")
            read -r b blo bhi _ < <(spread < "$tmp/$model.$k.2")
            awk -v m="$model" -v w="${settings[$k]}" -v q=$q -v qlo=$qlo -v qhi=$qhi -v a=$a -v alo=$alo -v ahi=$ahi \
                -v b=$b -v blo=$blo -v bhi=$bhi 'BEGIN { printf "| %s | %s | %s (%s-%s) | %s (%s-%s) | %s (%s-%s) | %.1fx | %.1fx |\n",
                m, w, q, qlo, qhi, a, alo, ahi, b, blo, bhi, a / q, b / q }'
        done
    done
    echo
    echo "char-small: bin/train's default preset; tiny: $(flags_of tiny). \"as bin/train runs\": idle threads"
    echo "spin 3000 times, then sleep, and a stream's team is one thread while a load leaves a core free, as"
    echo "the program sets them; teams kept whole: OMP_DYNAMIC=false; libgomp's default spins: 300,000"
    echo "(GOMP_SPINCOUNT=300000 set by hand, as a program that sets nothing runs)."
} | tee $results/load.md
echo "wrote $results/load.md"
