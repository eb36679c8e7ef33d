# Sourced by the network-namespace tests: netns_up makes namespace $ns joined to the root
# namespace by a veth pair, with a /30 of 198.18.0.0/15 (reserved for benchmarking) chosen from
# the pid so parallel runs differ: $host_ip on $host_if here, $ns_ip on $ns_if inside. It
# installs a trap that removes them, and kills the pids in $pids, on any exit (also when
# interrupted). Exit 77 (skip) when namespaces cannot be made here.
id=$$
ns=dsgd-t$id
host_if=dsgdh$((id % 100000))
ns_if=dsgdw$((id % 100000))
n=$(( (id % 16000) * 4 ))
net="198.18.$((n / 256))"
host_ip="$net.$((n % 256 + 1))"
ns_ip="$net.$((n % 256 + 2))"
tmp=$(mktemp -d)
pids=()
netns_cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true  # whatever still runs in it
  ip netns del "$ns" 2>/dev/null || true
  ip link del "$host_if" 2>/dev/null || true
  rm -rf "$tmp"
}
netns_up() {
  trap netns_cleanup EXIT
  trap 'exit 130' INT TERM
  if ! ip netns add "$ns" 2>"$tmp/err"; then
    echo "SKIP: cannot create a network namespace here ($(cat "$tmp/err")); needs root or CAP_NET_ADMIN"
    exit 77
  fi
  ip link add "$host_if" type veth peer name "$ns_if"
  ip link set "$ns_if" netns "$ns"
  ip addr add "$host_ip/30" dev "$host_if"
  ip link set "$host_if" up
  ip -n "$ns" addr add "$ns_ip/30" dev "$ns_if"
  ip -n "$ns" link set "$ns_if" up
  ip -n "$ns" link set lo up
}
# Waits for the driver (stderr in $1) to print its worker command; sets $address.
wait_for_driver_address() {
  address=""
  for _ in $(seq 100); do
    address=$(sed -n 's/.*--driver \([0-9.]*:[0-9]*\) --token.*/\1/p' "$1" | head -1)
    [ -n "$address" ] && return 0
    sleep 0.1
  done
  echo "FAIL: the driver never printed its address"; cat "$1"; exit 1
}
