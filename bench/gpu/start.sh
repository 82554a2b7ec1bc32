#!/usr/bin/env bash
# Start the lanes in their own process sessions (they outlive this call), from a copy of the repo.
set -u
Q=/tmp/q; mkdir -p $Q
rm -rf /tmp/repo && mkdir -p /tmp/repo && tar --exclude=./.carry -cf - . | tar -xf - -C /tmp/repo
rm -rf /tmp/gpu && cp -r bench/gpu /tmp/gpu
nvidia-smi > $Q/smi.txt 2>&1
date -u +%T > $Q/started
for lane in "$@"; do
  setsid bash /tmp/gpu/lane-$lane.sh > $Q/lane-$lane.log 2>&1 < /dev/null &
done
sleep 2; ls $Q
