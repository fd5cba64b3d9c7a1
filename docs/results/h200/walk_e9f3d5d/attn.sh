python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site gpu_carry/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
CUDA_VISIBLE_DEVICES= timeout 100 python3 gpu_carry/bench_attn.py hidden 2>&1 | grep -v Warn
CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=2 timeout 100 python3 gpu_carry/bench_attn.py hidden omp2 2>&1 | grep -v Warn
