#!/usr/bin/env bash
# Install size and time of each install shape of fstream (issue 39), into fresh venvs, with a warm pip cache.
# usage: [SHAPES=...] measure.sh SRC_REPO REV OUT_TSV [RUNS]
#   SRC_REPO  a git repository of fstream; each run installs from a fresh clone of it at REV (so a run
#             builds the native module from scratch, as on a new machine; cargo's own download cache is warm)
#   OUT_TSV   appended: one line per install
# Each shape is installed RUNS times (default 2) after one warm-up install of `.[all]` that fills pip's cache
# (not recorded). pip is upgraded in each fresh venv before the timed install (not timed).
set -euo pipefail
SRC=$1 REV=$2 OUT=$3 RUNS=${4:-2}
PY=${PYTHON:-python3.11}
WORK=$(mktemp -d /tmp/install-footprint.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
export PATH="$PATH:$HOME/.cargo/bin"  # cargo where rustup puts it, as the Makefile does
# SHAPES: one line each, label|extras after '.'|environment of the pip command
SHAPES=${SHAPES:-"provider||FSTREAM_NATIVE_BUILD=0
provider+native|| 
agent|[agent]| 
airflow|[airflow]|FSTREAM_NATIVE_BUILD=0
all|[all]| "}
[ -s "$OUT" ] || printf 'date\trev\tshape\tcommand\trun\tseconds\tsite_packages_bytes\tdistributions\tnative_module\tpip\n' >"$OUT"

install() {  # install SHAPE EXTRA ENV RUN RECORD
  local shape=$1 extra=$2 envs=$3 run=$4 record=$5
  local venv="$WORK/venv-$shape-$run" src="$WORK/src-$shape-$run"
  git clone -q "$SRC" "$src" && git -C "$src" checkout -q "$REV"
  "$PY" -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip >/dev/null
  local cmd="${envs:+$envs }pip install '.$extra'"
  local t0 t1
  t0=$(date +%s.%N)
  (cd "$src" && env $envs "$venv/bin/pip" install -q ".$extra" >"$WORK/log" 2>&1) || { cat "$WORK/log" >&2; exit 1; }
  t1=$(date +%s.%N)
  if [ "$record" = 1 ]; then
    local site bytes n native
    site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    bytes=$(du -sb "$site" | cut -f1)
    n=$("$venv/bin/pip" list --format=freeze 2>/dev/null | wc -l)
    native=$(cd / && "$venv/bin/python" -c 'import importlib.util as u; print("yes" if u.find_spec("transfer_agent.storage._blake3tree") else "no")')
    printf '%s\t%s\t%s\t%s\t%s\t%.1f\t%s\t%s\t%s\t%s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$(git -C "$src" rev-parse --short HEAD)" \
      "$shape" "$cmd" "$run" "$(echo "$t1 - $t0" | bc)" "$bytes" "$n" "$native" \
      "$("$venv/bin/pip" --version | cut -d' ' -f2)" | tee -a "$OUT"
  fi
  rm -rf "$venv" "$src"
}

install warmup "$(echo "$SHAPES" | awk -F'|' 'END{print $2}')" "" 0 0  # fills pip's cache with the largest shape
for run in $(seq 1 "$RUNS"); do
  while IFS='|' read -r shape extra envs; do
    install "$shape" "$extra" "$(echo $envs)" "$run" 1
  done <<<"$SHAPES"
done
