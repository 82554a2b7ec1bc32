#!/usr/bin/env bash
# Wait up to $1 s for every started lane to finish; print their tails; pack /tmp/q into $OUT each round.
Q=/tmp/q; end=$((SECONDS+${1:-500}))
pack() { tar -czf $OUT/q.tgz -C /tmp q 2>/dev/null; }
while :; do
  pack
  n=$(ls $Q/lane*.log 2>/dev/null | wc -l); d=$(ls $Q/lane*.done 2>/dev/null | wc -l)
  if [ "$d" -ge "$n" ]; then echo "all done"; break; fi
  [ $SECONDS -ge $end ] && break
  sleep 15
done
date -u +%T; nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv 2>&1 | tail -1
for f in $Q/lane*.log; do echo "##### $f"; grep -a "^===" $f | tail -6; tail -c 1500 $f; done
pack
