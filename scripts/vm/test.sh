#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The agent's live-kernel tests on the kernels GPU fleets run: each test
# binary below runs, as built here, inside a VM booted on Debian's packaged
# 5.10, 6.1 and 6.12 kernels (scripts/vm/prepare.sh, run.sh), one kernel at
# a time. This machine's own kernel runs them in `cargo nextest run`.
#
#   scripts/vm/test.sh [SERIES...]      default: 5.10 6.1 6.12
#
# INGERO_VM_TESTS: test targets of ingero-node (default "kernel transparent dlopen scope";
# `stacks` needs CPython and bpf_loop: 5.17+). Exit status: the number of
# kernels where a test failed.
set -euo pipefail
cd "$(dirname "$0")/../.."
series=("$@")
[ ${#series[@]} -gt 0 ] || series=(5.10 6.1 6.12)
targets=(${INGERO_VM_TESTS:-kernel transparent dlopen scope})

scripts/vm/prepare.sh
# The test executables `cargo nextest run --workspace --features ingero/mcp` runs here (built with
# the workspace's features, so nothing is rebuilt).
mapfile -t bins < <(cargo test --workspace --features ingero/mcp --locked --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys
want = sys.argv[1:]
for l in sys.stdin:
    m = json.loads(l)
    t = m.get("target", {})
    if m.get("reason") == "compiler-artifact" and m.get("executable") and t.get("kind") == ["test"] \
       and "/node#" in m["package_id"] + "#" and t["name"] in want:
        print(m["executable"])' "${targets[@]}")
[ ${#bins[@]} -eq ${#targets[@]} ] || { echo "expected ${#targets[@]} test binaries, got: ${bins[*]:-none}" >&2; exit 1; }

failed=0
for s in "${series[@]}"; do
  for b in "${bins[@]}"; do
    name="$(basename "$b" | sed 's/-[0-9a-f]*$//')"
    echo "== Linux $s: $name"
    start=$SECONDS
    # One test at a time: a 2-vCPU emulated machine, as the realtime group here.
    if scripts/vm/run.sh "$s" "$b" --test-threads 1 2>&1 | tee "/tmp/ingero-vm-$s-$name.log" \
      | grep -E '^(test |test result|thread .* panicked|  left|  right|assertion)'; then :; fi
    if ! grep -q '^test result: ok' "/tmp/ingero-vm-$s-$name.log"; then
      echo "FAILED on Linux $s: $name (whole output: /tmp/ingero-vm-$s-$name.log)"
      failed=$((failed + 1))
    fi
    echo "   ($((SECONDS - start)) s)"
  done
done
exit "$failed"
