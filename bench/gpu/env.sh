export PYTHONPATH=/tmp/verl-site:/tmp/vllm-site:/tmp/repo VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
Q=/tmp/q; cd /tmp/repo
step() { echo "=== $(date -u +%T) $*"; local t0=$SECONDS; "$@"; local rc=$?; echo "=== $(date -u +%T) rc=$rc in $((SECONDS-t0)) s: $*"; }
