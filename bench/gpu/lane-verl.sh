source /tmp/gpu/env.sh
step timeout 560 python -m pytest tests/server/test_serve_cli.py -k "closes_its_engine or started_ray" -q -rs -p no:cacheprovider
step timeout 450 python bench/async_training.py --budget 200 --trainer verl --engine vllm --device cuda \
  --gpu-memory-utilization 0.2 --json $Q/async_verl.json
touch $Q/lane-verl.done
