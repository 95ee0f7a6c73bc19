# bench/timing.sh: what the bench scripts share (sourced): the environment they measure in,
# and reading bin/train's step times.

# As a user's machine runs: OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE, which some machines'
# environments set for older OpenBLAS builds (on an AMD Zen 4 they held OpenBLAS to its Haswell
# kernels, a third slower than the Cooperlake ones it picks itself), are unset for every command
# of a benchmark, both sides alike; each side prints the kernels it then runs.
for var in OPENBLAS_CORETYPE OPENBLAS_L2_SIZE; do
    if [ -n "${!var+set}" ]; then
        echo "bench: $var=${!var} unset for the benchmark, as on a user's machine"
        unset $var
    fi
done

# The ms/iter of every progress line past a warm-up, one a line.
step_ms() {
    awk '$1 == "iter" && $2 + 0 >= 5 { for (i = 3; i <= NF; i++) if ($i == "ms/iter,") print $(i - 1) }'
}

# Median, quartiles and count of the numbers on stdin.
spread() {
    sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) { print "- - - 0"; exit }
        printf "%.1f %.1f %.1f %d\n", v[int(0.5 * (NR - 1) + 1.5)], v[int(0.25 * (NR - 1) + 1.5)],
        v[int(0.75 * (NR - 1) + 1.5)], NR }'
}
