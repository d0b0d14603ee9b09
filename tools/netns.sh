#!/usr/bin/env bash
# Two network namespaces joined by a veth pair, with tbf rate limits in each direction:
# the emulated device–edge link of the EdgeMove benchmark. Needs root (ip, tc).
#
#   tools/netns.sh up   [--name NAME] [--up RATE] [--down RATE] [--burst SIZE] [--latency TIME]
#   tools/netns.sh rate [--name NAME] [--up RATE] [--down RATE] [--burst SIZE] [--latency TIME]
#   tools/netns.sh status [--name NAME]
#   tools/netns.sh down [--name NAME]
#   tools/netns.sh throttle [--name NAME] --factor F [--period-us P]
#   tools/netns.sh unthrottle [--name NAME]
#
# `up` creates namespaces NAME-dev (the device, 10.210.0.1) and NAME-edge (the edge
# server, 10.210.0.2), joined by veth NAME-d <-> NAME-e, each end with a tbf qdisc on its
# egress: the device end's is the uplink, the edge end's the downlink. RATE is a tc rate
# (20mbit, 5mbit, 100mbit, 2500kbit); `rate` changes the limits of a running pair (the
# mobility case); `down` deletes both namespaces (and with them the veth pair).
# Defaults: NAME=ef, 20mbit both ways, at most 100 ms queued, and a bucket of 2 ms of
# traffic at the rate (at least 3028 bytes, two full frames): a bigger bucket lets a whole
# micro-batch through at line speed after an idle moment (a 64 KiB bucket at 5mbit made
# 66 KB steps take half the time the rate allows), a smaller one cannot reach the rate.
#
# `throttle` makes a CPU cgroup NAME-dev (cgroup v2 cpu.max, or v1 cpu.cfs_quota_us)
# whose processes together get 1/F of one CPU: a quota of P/F in every period of P µs
# (default 10000; the kernel's least quota is 1000 µs, so F ≤ P/1000). A shorter period
# spreads the quota finer: with 10 ms a 1/4-CPU process runs 2.5 ms, then stalls 7.5 ms,
# and a few-millisecond operation takes anywhere from its own time to four times it plus
# a stall; with 4 ms (F = 4, P = 4000) it stalls at most 3 ms at a time, nearer a CPU
# that is uniformly 4x slower. A device process joins it by writing
# its pid to the cgroup's cgroup.procs (tools/edge_bench.sh does, with DEVICE_SLOW=F);
# its threads and children stay in it. `unthrottle` removes it.
#
# Delay: netem is not available on the machines this runs on, so the script adds none;
# add delay in-process with the link shaper (crates/shaper), e.g. a shaper inside NAME-dev
# forwarding to the edge's address.
#
# Run something in a namespace with `ip netns exec NAME-edge edgefreeze edge serve
# --listen 10.210.0.2:50051 ...` and `ip netns exec NAME-dev edgefreeze device train
# --edge 10.210.0.2:50051 ...`. Every command here is bounded by a timeout.
set -euo pipefail

name=ef
up_rate=20mbit
down_rate=20mbit
burst=
latency=100ms
factor=
period=10000
T=10 # seconds any one ip/tc command may take

usage() { sed -n '2,38p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }

[[ $# -ge 1 ]] || usage
command=$1
shift
while [[ $# -gt 0 ]]; do
    case $1 in
        --name) name=$2; shift 2 ;;
        --up) up_rate=$2; shift 2 ;;
        --down) down_rate=$2; shift 2 ;;
        --burst) burst=$2; shift 2 ;;
        --latency) latency=$2; shift 2 ;;
        --factor) factor=$2; shift 2 ;;
        --period-us) period=$2; shift 2 ;;
        -h|--help) usage ;;
        *) echo "netns.sh: unknown argument $1" >&2; usage ;;
    esac
done
if ! [[ $name =~ ^[a-z][a-z0-9]{0,7}$ ]]; then
    echo "netns.sh: --name must be 1 to 8 of [a-z0-9], starting with a letter (interface names are short)" >&2
    exit 2
fi
for rate in "$up_rate" "$down_rate"; do
    if ! [[ $rate =~ ^[0-9]+(\.[0-9]+)?(bit|kbit|mbit|gbit)$ ]]; then
        echo "netns.sh: rate $rate is not a tc rate like 20mbit or 2500kbit" >&2
        exit 2
    fi
done

dev=$name-dev
edge=$name-edge
run() { timeout "$T" "$@"; }

# Bytes in 2 ms at a tc rate, at least 3028.
bucket() {
    awk -v r="$1" 'BEGIN {
        n = r + 0; u = substr(r, length(n "") + 1)
        m = (u == "bit") ? 1 : (u == "kbit") ? 1e3 : (u == "mbit") ? 1e6 : 1e9
        b = int(n * m / 8 * 0.002); if (b < 3028) b = 3028; print b
    }'
}

shape() { # namespace interface rate
    run ip netns exec "$1" tc qdisc replace dev "$2" root tbf rate "$3" burst "${burst:-$(bucket "$3")}" \
        latency "$latency"
}

# The device's CPU cgroup: cgroup v2 where the unified hierarchy has the cpu controller,
# else v1's cpu hierarchy.
cgroup_dir() {
    if [[ -e /sys/fs/cgroup/cgroup.controllers ]]; then echo "/sys/fs/cgroup/$1"; else echo "/sys/fs/cgroup/cpu/$1"; fi
}

case $command in
    up)
        if run ip netns list | grep -qw -- "$dev"; then
            echo "netns.sh: namespace $dev exists; run 'tools/netns.sh down --name $name' first" >&2
            exit 1
        fi
        # Undo a half-built pair on any failure.
        trap 'run ip netns del "$dev" 2>/dev/null || true; run ip netns del "$edge" 2>/dev/null || true' ERR
        run ip netns add "$dev"
        run ip netns add "$edge"
        run ip link add "$name-d" netns "$dev" type veth peer name "$name-e" netns "$edge"
        run ip -n "$dev" addr add 10.210.0.1/30 dev "$name-d"
        run ip -n "$edge" addr add 10.210.0.2/30 dev "$name-e"
        for ns in "$dev" "$edge"; do run ip -n "$ns" link set lo up; done
        run ip -n "$dev" link set "$name-d" up
        run ip -n "$edge" link set "$name-e" up
        shape "$dev" "$name-d" "$up_rate"
        shape "$edge" "$name-e" "$down_rate"
        trap - ERR
        echo "device namespace $dev (10.210.0.1), edge namespace $edge (10.210.0.2): up $up_rate, down $down_rate"
        ;;
    rate)
        shape "$dev" "$name-d" "$up_rate"
        shape "$edge" "$name-e" "$down_rate"
        echo "up $up_rate, down $down_rate"
        ;;
    status)
        run ip netns exec "$dev" tc qdisc show dev "$name-d"
        run ip netns exec "$edge" tc qdisc show dev "$name-e"
        ;;
    throttle)
        if ! [[ $factor =~ ^([1-9]|10)(\.[0-9]+)?$ ]] || awk -v f="$factor" 'BEGIN { exit !(f > 10) }'; then
            echo "netns.sh: --factor must be a number from 1 to 10, not '$factor'" >&2
            exit 2
        fi
        if ! [[ $period =~ ^[0-9]{4,7}$ ]] || ((period > 1000000)); then
            echo "netns.sh: --period-us must be 1000 to 1000000 microseconds, not '$period'" >&2
            exit 2
        fi
        quota=$(awk -v f="$factor" -v p="$period" 'BEGIN { printf "%d", p / f }')
        if ((quota < 1000)); then
            echo "netns.sh: a quota of $quota us (period $period us / factor $factor) is below the kernel's least, 1000 us: use a longer --period-us" >&2
            exit 2
        fi
        cg=$(cgroup_dir "$dev")
        mkdir -p "$cg"
        if [[ -e $cg/cpu.max ]]; then echo "$quota $period" > "$cg/cpu.max"
        else echo "$period" > "$cg/cpu.cfs_period_us"; echo "$quota" > "$cg/cpu.cfs_quota_us"; fi
        echo "$cg: ${quota} us of CPU in every $period us (1/$factor of one CPU)"
        ;;
    unthrottle)
        cg=$(cgroup_dir "$dev")
        [[ ! -d $cg ]] || rmdir "$cg"
        echo "removed $cg"
        ;;
    down)
        run ip netns del "$dev" 2>/dev/null || true
        run ip netns del "$edge" 2>/dev/null || true
        echo "deleted $dev and $edge"
        ;;
    *) usage ;;
esac
