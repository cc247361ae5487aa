#!/usr/bin/env bash
# The README's first command as a new user runs it (issue 39): a fresh clone of this checkout, owned by an
# unprivileged user with a fresh home (so a fresh state directory and pip cache), no FSTREAM_* settings, and no
# system Redis or Valkey server reachable on PATH (a shim that fails loudly stands in front of any installed one:
# the demo must use the server its own install bundles). `make demo` must succeed and verify its files.
# Run as root (CI); as anyone else it says so and does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != "0" ]; then
  echo ".ci/new-user.sh: needs root to create the unprivileged user; skipped" >&2
  exit 0
fi
user="${FSTREAM_CI_USER:-fstream-newuser}"
id "$user" >/dev/null 2>&1 || useradd --create-home --shell /bin/bash "$user"
pkill -u "$user" 2>/dev/null || true  # what an earlier run of this user left (its demo's embedded server)
home="$(getent passwd "$user" | cut -d: -f6)"
clone="$home/fstream"
rm -rf "$clone" "$home/.local" "$home/.cache" "$home/.shim"  # a fresh home each run: no state, no pip cache
git clone -q "$PWD" "$clone"
[ -d ../shared ] && ln -sfn "$(cd ../shared && pwd)" "$home/shared"
mkdir -p "$home/.shim"
for s in redis-server valkey-server; do
  printf '#!/bin/sh\necho "new-user run: a system %s was started ($0): the demo must use its bundled server" >&2\nexit 97\n' "$s" > "$home/.shim/$s"
  chmod 755 "$home/.shim/$s"
done
chown -R "$user:" "$home"
start=$(date +%s)
# env -i: nothing of root's environment (no FSTREAM_*, no cargo on PATH: rustup's ~/.cargo is root's own)
env -i HOME="$home" USER="$user" LOGNAME="$user" LANG=C.UTF-8 TERM=dumb \
    PATH="$home/.shim:/usr/local/bin:/usr/bin:/bin" \
    setpriv --reuid="$user" --regid="$user" --init-groups \
    bash -c 'cd "$HOME/fstream" && make demo' 2>&1 | tee "$home/demo.log"
rc=${PIPESTATUS[0]}
# the demo leaves its embedded server running for the user's next command; this run has none: stop it
env -i HOME="$home" PATH="/usr/bin:/bin" setpriv --reuid="$user" --regid="$user" --init-groups \
    bash -c 'cd "$HOME/fstream" && .venv/bin/fstream redis stop' || true
echo ".ci/new-user.sh: make demo as $user in a fresh clone: exit $rc in $(( $(date +%s) - start )) s"
if [ "$rc" != 0 ]; then exit "$rc"; fi
grep -q "byte-for-byte identical: yes" "$home/demo.log" || {
  echo ".ci/new-user.sh: the demo did not verify its files (no 'byte-for-byte identical: yes')" >&2; exit 1; }
