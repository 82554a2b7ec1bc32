source /tmp/gpu/env.sh
step timeout 360 python bench/multi_gpu.py --gpus 1 --shape 0.5b --steps 2 --weight-sync direct --resume-check --json $Q/mg_resume.json
step timeout 120 python -m pytest tests/server/test_checkpoint_journal.py -k cuda -q -rs -p no:cacheprovider
step python -c "import sys; from pathlib import Path; sys.path.insert(0, 'bench'); from multi_gpu import build_model; print(build_model('1.5b', Path('/tmp/q15'), 0))"
step timeout 300 python bench/checkpoint.py --overhead-only --model /tmp/q15 --device cuda --rounds 2 --block 2
touch $Q/lane-ckpt.done
