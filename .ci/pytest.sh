#!/usr/bin/env bash
# Run the test suite in two phases and print the 30 slowest tests of each:
#   1. every test not marked `serial`, on FSTREAM_TEST_WORKERS (default 2) pytest-xdist workers;
#   2. the `serial` ones (the emulated WAN, wall-time and rate goals: tests/conftest.py), one at a time.
# Phase 1 hands out whole files (--dist loadfile), so a module fixture (a migrated Airflow home with its
# api-server, the Redis Cluster, a paced transfer) is built once, on one worker, not once per worker; in
# collection order (--no-loadscope-reorder), where tests/conftest.py puts the files with a `slow` test first.
# Arguments go to both phases (`make test PYTEST_ARGS=tests/test_jobs.py` runs that file's tests in the phase
# their marker says). A phase that collects nothing (pytest's exit 5) is fine while the other ran tests;
# the whole run collecting nothing is a failure, as is either phase failing.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
WORKERS=${FSTREAM_TEST_WORKERS:-2}

parallel=(-n "$WORKERS" --dist loadfile --no-loadscope-reorder)
if [ "$WORKERS" -le 1 ] 2>/dev/null; then
  parallel=()
elif ! "$PY" -c "import xdist" 2>/dev/null; then
  echo ".ci/pytest.sh: pytest-xdist is not installed (make install): phase 1 runs on one process" >&2
  parallel=()
fi

phase() {  # phase NAME ARGS...: run pytest, print its wall time, leave its exit code in $rc
  local name=$1 t0=$SECONDS
  shift
  echo "=== .ci/pytest.sh: phase $name: pytest $*" >&2
  "$PY" -m pytest -ra --durations=30 "$@"
  rc=$?
  echo "=== .ci/pytest.sh: phase $name: exit $rc after $((SECONDS - t0)) s" >&2
}

phase "1 (not serial, ${WORKERS} workers)" "${parallel[@]}" -m "not serial" "$@"
rc1=$rc
phase "2 (serial)" -p no:xdist -m serial "$@"
rc2=$rc

echo "=== .ci/pytest.sh: total ${SECONDS} s (phase 1 exit $rc1, phase 2 exit $rc2)" >&2
for r in "$rc1" "$rc2"; do
  if [ "$r" -ne 0 ] && [ "$r" -ne 5 ]; then
    exit "$r"
  fi
done
if [ "$rc1" -eq 5 ] && [ "$rc2" -eq 5 ]; then
  echo "pytest collected no tests: treating as failure" >&2
  exit 1
fi
exit 0
