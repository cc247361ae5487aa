#!/usr/bin/env bash
# Install the tools only benchmarks and the WAN testbed need (Debian packages, root).
set -euo pipefail
if [ "$(id -u)" != "0" ]; then
  echo "bench-deps: needs root to install Debian packages (iperf3, rsync, GridFTP, sshd)" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq iperf3 rsync openssh-server openssh-client iproute2 gcc libc6-dev e2fsprogs util-linux \
  globus-gass-copy-progs globus-gridftp-server-progs redis-server >/dev/null
echo "bench-deps: installed"
