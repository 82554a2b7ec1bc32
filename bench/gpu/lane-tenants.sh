source /tmp/gpu/env.sh
# issue 36 on the GPU, alone (its timings are the point): ~25 min of device time
step timeout 900 python bench/tenants.py --engine vllm --device cuda --dtype bfloat16
mkdir -p /tmp/study && cd /tmp/study
step timeout 780 python -m a3r.app.cli research "find min stable batch size on arithmetic" --budget-minutes 8 \
  --serve-option engine=vllm --serve-option device=cuda
cp -r /tmp/study/.a3r $Q/study-a3r 2>/dev/null
touch $Q/lane-tenants.done
