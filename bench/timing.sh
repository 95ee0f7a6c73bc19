# bench/timing.sh: what the bench scripts share to read bin/train's step times (sourced).

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
