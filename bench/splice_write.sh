#!/usr/bin/env bash
# The daemon CPU time per WRITE of our passthrough_ll with and without
# `-o splice_write`, by WRITE size, through the page cache (cache=auto: the
# kernel sends its own pages, which a splice can pass on without copying)
# and with DIRECT_IO (cache=never: the kernel copies the caller's pages into
# the pipe). Single-threaded daemon (-s), dd over a 32 MiB file on this
# machine's /tmp (its filesystem is the source), 2 rounds per row.
#   bench/splice_write.sh [SIZES...]      default: 4k 16k 32k 64k 128k 512k
# Needs root and the release example (cargo build --release --example passthrough_ll).
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${CARGO_TARGET_DIR:-$PWD/target}/release/examples/passthrough_ll"
[ -x "$bin" ] || { echo "build it first: cargo build --release --example passthrough_ll" >&2; exit 1; }
work="$(mktemp -d /tmp/fuse-wire-splice-write.XXXXXX)"
trap 'umount -l "$work/mnt" 2>/dev/null || true; rm -rf --one-file-system "$work"' EXIT
mkdir -p "$work/src" "$work/mnt"
sizes=("$@"); [ ${#sizes[@]} -gt 0 ] || sizes=(4k 16k 32k 64k 128k 512k)

# one MODE CACHE BS MIB: prints "us_cpu_per_write MB/s"
one() {
    local mode=$1 cache=$2 bs=$3 mib=$4
    local opts="source=$work/src,cache=$cache,max_write=524288"
    [ "$mode" = splice ] && opts="$opts,splice_write,splice_write_min=1"
    rm -f "$work/src/f"
    "$bin" -s -o "$opts" "$work/mnt" 2>/dev/null &
    local pid=$! i
    for i in $(seq 100); do mountpoint -q "$work/mnt" && break; sleep 0.05; done
    mountpoint -q "$work/mnt" || { kill "$pid"; echo "no mount" >&2; exit 1; }
    local bytes per passes t0 t1 s0 s1
    bytes=$(numfmt --from=iec "${bs^^}")
    per=$((32 * 1024 * 1024 / bytes)); passes=$((mib / 32))
    dd if=/dev/zero of="$work/mnt/f" bs="$bs" count="$per" 2>/dev/null
    t0=$(awk '{print $14 + $15}' "/proc/$pid/stat"); s0=$(date +%s%N)
    for i in $(seq "$passes"); do
        dd if=/dev/zero of="$work/mnt/f" bs="$bs" count="$per" conv=notrunc 2>/dev/null
    done
    s1=$(date +%s%N); t1=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    umount "$work/mnt"; wait "$pid" || true
    local hz; hz=$(getconf CLK_TCK)
    echo "$(echo "scale=1; ($t1 - $t0) * 1000000 / $hz / ($per * $passes)" | bc) $((mib * 1000000000 / (s1 - s0)))"
}

printf '%-6s %-6s %-8s %14s %14s %8s\n' cache size round "read us/WRITE" "splice us/WRITE" "MB/s r/s"
for cache in auto never; do
    for bs in "${sizes[@]}"; do
        case $bs in 4k) mib=128 ;; 16k) mib=256 ;; *) mib=512 ;; esac
        for r in 1 2; do
            read -r ur mr < <(one read "$cache" "$bs" "$mib")
            read -r us ms < <(one splice "$cache" "$bs" "$mib")
            printf '%-6s %-6s %-8s %14s %14s %8s\n' "$cache" "$bs" "$r" "$ur" "$us" "$mr/$ms"
        done
    done
done
