#!/usr/bin/env bash
# Remote mode with the control plane over mutual TLS, across a network namespace, the driver's
# port on the link recorded with tcpdump. The same job runs twice, with `dsgd tls-keys` keys and with --no-tls;
# one worker joins from inside the namespace (its traffic crosses the recorded link), one from
# here. Asserts: with TLS, processes holding the token but another CA's keys, or none, are
# refused, the job trains as usual, and the recording holds neither the token nor what a rank
# publishes in the rendezvous store (size, pid, pair secret, host); with --no-tls the same search
# finds both (the search works).
# Creates and removes its namespace and link itself (also when interrupted). Exit 77 (skip)
# when namespaces cannot be made here. Usage: remote_tls_netns_test.sh DSGD_BINARY
set -euo pipefail
dsgd=$1
source "$(dirname "$0")/netns.sh"
command -v tcpdump >/dev/null || { echo "FAIL: tcpdump is missing (scripts/install-deps.sh installs it)"; exit 1; }
netns_up

"$dsgd" tls-keys "$tmp/keys" >/dev/null
"$dsgd" tls-keys "$tmp/other" >/dev/null

# run_job NAME FLAGS...: the job with a recording of the link in $tmp/NAME.pcap.
run_job() {
  local name=$1
  shift
  "$dsgd" train --workers 2 --listen "$host_ip:0" --token "tok-$name-$id" --model mlp --dataset synthetic \
    --synthetic-samples 2048 --image-size 8 --epochs 2 --batch-size 32 --threads 1 \
    --json-out "$tmp/$name.json" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" &
  local driver=$!
  pids+=("$driver")
  wait_for_driver_address "$tmp/$name.err"
  # The control plane: the driver's port (Gloo's payload, the bulk, goes between other ports).
  tcpdump -i "$host_if" -U -s 0 -w "$tmp/$name.pcap" "tcp port ${address##*:}" 2>"$tmp/$name.tcpdump" &
  local capture=$!
  pids+=("$capture")
  for _ in $(seq 50); do grep -q "listening on" "$tmp/$name.tcpdump" && break; sleep 0.1; done
  if [ "$name" = tls ]; then
    # The token, but another job's keys, or none: refused (from inside the namespace, recorded).
    for keys in "--tls-dir $tmp/other" ""; do
      # shellcheck disable=SC2086
      if ip netns exec "$ns" "$dsgd" worker --driver "$address" --token "tok-$name-$id" --host-id intruder $keys \
        >"$tmp/intruder.out" 2>&1; then
        echo "FAIL: a worker with ${keys:-no keys} was accepted"; exit 1
      fi
      grep -q "TLS" "$tmp/intruder.out" || { echo "FAIL: the refusal does not say TLS"; cat "$tmp/intruder.out"; exit 1; }
      echo "refused (${keys:-no keys}): $(grep -o 'register: .*' "$tmp/intruder.out" | head -1 | cut -c1-200)"
    done
  fi
  local keys=()
  [ "$name" = tls ] && keys=(--tls-dir "$tmp/keys")
  ip netns exec "$ns" "$dsgd" worker --driver "$address" --token "tok-$name-$id" --host-id remote-host "${keys[@]}" \
    >"$tmp/$name.remote" 2>&1 &
  pids+=("$!")
  DSGD_TOKEN="tok-$name-$id" "$dsgd" worker --driver "$address" --host-id local-host "${keys[@]}" \
    >"$tmp/$name.local" 2>&1 &
  pids+=("$!")
  if ! wait "$driver"; then
    echo "FAIL: the $name driver failed"; cat "$tmp/$name.err" "$tmp/$name.remote" "$tmp/$name.local"; exit 1
  fi
  sleep 0.5
  kill -INT "$capture"; wait "$capture" || true
}

run_job tls --tls-dir "$tmp/keys"
run_job plain --no-tls

/usr/bin/python3 - "$tmp" "$id" <<'PY'
import json, re, sys
tmp, job = sys.argv[1], sys.argv[2]
for name, control_plane in (("tls", "tls"), ("plain", "plaintext")):
    r = json.load(open(f"{tmp}/{name}.json"))
    assert r["control_plane"] == control_plane, (name, r["control_plane"])
    assert r["test_accuracy"] > 0.2, (name, r["test_accuracy"])   # 10 classes: chance is 0.1
    capture = open(f"{tmp}/{name}.pcap", "rb").read()
    token = f"tok-{name}-{job}".encode()
    published = re.search(rb"\n[0-9]+\n[0-9a-f]{32,}\n", capture)  # a rank's "size\npid\nsecret\nhost"
    found = {"token": token in capture, "pair secrets": published is not None}
    print(f"{name}: {len(capture)} bytes recorded, test accuracy {r['test_accuracy']:.3f}, found: {found}")
    if name == "tls":
        assert not any(found.values()), f"TLS run: the recording holds {found}"
    else:
        assert all(found.values()), f"plaintext run: the search missed {found} (is the link recorded?)"
print("PASS: with TLS the link carries neither the token nor the pair secrets; refused without the job's keys")
PY
