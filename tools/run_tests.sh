#!/usr/bin/env bash
# run_tests.sh TEST_BINARY [GoogleTest flags...]: runs a GoogleTest binary split into shards that run at once
# (GoogleTest's own sharding: GTEST_TOTAL_SHARDS / GTEST_SHARD_INDEX), one per core, up to 4; TEST_SHARDS=N
# overrides, TEST_SHARDS=1 runs the binary as it is. Each shard has OMP_NUM_THREADS=1 (unless set) and its own
# temp folder (TEST_TMPDIR and TMPDIR), so no two shards share a test's files. Each shard's output is printed
# whole when the shards are done, then one line per shard; exit 1 if any shard failed.
# `make test` runs the cpu + meta suite with it: on CI's two cores it halves the suite's wall time.
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: $0 TEST_BINARY [GoogleTest flags...]" >&2; exit 2; }
bin=$1
shift
[ -x "$bin" ] || { echo "$0: $bin is not an executable test binary (build it first: make $bin)" >&2; exit 2; }
cores=$(nproc 2>/dev/null || echo 1)
shards=${TEST_SHARDS:-$((cores < 4 ? cores : 4))}
case $shards in
  '' | *[!0-9]* | 0) echo "$0: TEST_SHARDS='$shards' is not a positive whole number (try TEST_SHARDS=2)" >&2; exit 2 ;;
esac
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
if [ "$shards" -eq 1 ]; then exec "$bin" "$@"; fi

work=$(mktemp -d "${TMPDIR:-/tmp}/engine_test_shards.XXXXXX") || exit 2
trap 'rm -rf "$work"' EXIT
start=$(date +%s)
pids=()
for ((i = 0; i < shards; i++)); do
  mkdir -p "$work/tmp$i"
  GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i TEST_TMPDIR="$work/tmp$i/" TMPDIR="$work/tmp$i" \
    "$bin" "$@" > "$work/log$i" 2>&1 &
  pids+=($!)
done
echo "$bin: $shards shards running at once (TEST_SHARDS=$shards); each shard's output follows when all are done"
failed=0
summary=()
for ((i = 0; i < shards; i++)); do
  wait "${pids[$i]}"
  rc=$?
  [ "$rc" -eq 0 ] || failed=1
  passed=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$work/log$i" | tail -1)
  summary+=("shard $i of $shards: exit $rc, ${passed:-0} passed")
done
for ((i = 0; i < shards; i++)); do
  echo "===== shard $i of $shards ====="
  cat "$work/log$i"
done
printf '%s\n' "${summary[@]}"
echo "all shards done after $(($(date +%s) - start)) s"
if [ "$failed" -ne 0 ]; then
  echo "FAILED: a shard above failed (its [  FAILED  ] lines name the tests); rerun one with" \
       "$bin --gtest_filter=<name>" >&2
  exit 1
fi
