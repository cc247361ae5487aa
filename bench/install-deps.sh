#!/usr/bin/env bash
# Install the tools the benchmarks, the WAN testbed and the browser tests need (Debian packages, root;
# chromium: the Airflow UI tests drive Debian's browser with Playwright, which cannot download its own here;
# redis-tools: redis-cli, which tests/clusterkit.py joins a Redis Cluster with).
set -euo pipefail
if [ "$(id -u)" != "0" ]; then
  echo "bench-deps: needs root to install Debian packages (iperf3, rsync, GridFTP, sshd)" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq iperf3 rsync openssh-server openssh-client iproute2 gcc libc6-dev e2fsprogs util-linux \
  globus-gass-copy-progs globus-gridftp-server-progs redis-server redis-tools chromium tmux prometheus systemd >/dev/null
echo "bench-deps: installed"
