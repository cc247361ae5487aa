P=/work/main/.venv/bin/python
for rep in 1 2 3; do for mode in "$@"; do
  port=$((20000 + RANDOM % 10000))
  $P /tmp/proto/recv.py $mode $port /dev/shm/proto.part > /tmp/proto/r.out &
  rp=$!; while ! grep -q ready /tmp/proto/r.out 2>/dev/null; do sleep 0.05; done
  $P /tmp/proto/send.py $port; wait $rp; grep cpu /tmp/proto/r.out
done; done
