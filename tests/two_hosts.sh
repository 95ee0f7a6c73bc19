#!/bin/sh
# tests/two_hosts.sh LAUNCHER PROGRAM [ARGS...]: PROGRAM as two processes on two
# hosts, one each, for the multiprocess suite: two network namespaces of this
# machine joined by a veth pair stand for the hosts, and Open MPI is held to TCP
# between them (--mca btl tcp,self, over the pair's subnet only). LAUNCHER is
# the mpirun command (one string: the suite's, `mpirun --allow-run-as-root
# --oversubscribe` or ZF_MPIRUN); it runs in the first namespace, and reaches
# the second host as it would over ssh, through an agent that runs the command
# in the second namespace instead. Needs root and iproute2; exits with the
# program's status, and removes the namespaces, the pair and its files whatever
# happens. The names and the subnet come from this script's pid, so that runs
# side by side do not meet.
set -eu
[ $# -ge 2 ] || { echo "usage: $0 LAUNCHER PROGRAM [ARGS...]" >&2; exit 2; }
launcher=$1
shift
program=$1
shift
case $program in /*) ;; */*) program=$(pwd)/$program ;; esac

id=$$
a=zf${id}a
b=zf${id}b
net=10.213.$((id % 250)).
dir=$(mktemp -d /tmp/zf_hosts_XXXXXX)
cleanup() {
    ip netns del "$a" 2>/dev/null || true
    ip netns del "$b" 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT INT TERM

ip netns add "$a"
ip netns add "$b"
ip link add "${a}0" type veth peer name "${b}0"
ip link set "${a}0" netns "$a"
ip link set "${b}0" netns "$b"
ip -n "$a" addr add "${net}1/24" dev "${a}0"
ip -n "$b" addr add "${net}2/24" dev "${b}0"
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set "${a}0" up
ip -n "$b" link set "${b}0" up

# mpirun's remote shell: the command for host ${net}2 runs in the second namespace
cat >"$dir/agent" <<EOF
#!/bin/sh
host=\$1
shift
case \$host in ${net}2) ns=$b ;; *) ns=$a ;; esac
exec ip netns exec \$ns sh -c "\$*"
EOF
chmod +x "$dir/agent"
printf '%s1 slots=1\n%s2 slots=1\n' "$net" "$net" >"$dir/hosts"

status=0
# shellcheck disable=SC2086 # the launcher is words
ip netns exec "$a" $launcher --hostfile "$dir/hosts" --mca plm_rsh_agent "$dir/agent" \
    --mca btl tcp,self --mca btl_tcp_if_include "${net}0/24" --mca oob_tcp_if_include "${net}0/24" \
    -np 2 "$program" "$@" || status=$?
exit $status
