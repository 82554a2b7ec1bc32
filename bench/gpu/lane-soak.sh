source /tmp/gpu/env.sh
step timeout 1100 python bench/soak.py --engine vllm --device cuda --train --clients 200 --seconds ${SOAK_SECONDS:-600} \
  --gpu-shared --gpu-memory-utilization 0.15 --settle-timeout 150 --json $Q/soak.json
touch $Q/lane-soak.done
