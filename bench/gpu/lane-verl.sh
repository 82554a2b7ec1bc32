source /tmp/gpu/env.sh
step timeout 420 python -m pytest tests/server/test_serve_cli.py -k "closes_its_engine or started_ray" -q -rs -p no:cacheprovider
step timeout 700 python bench/async_training.py --trainer verl --engine vllm --device cuda \
  --gpu-memory-utilization 0.2 --json $Q/async_verl.json
touch $Q/lane-verl.done
