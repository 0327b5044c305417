export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT/g $OUT/k3 $OUT/dsv3
V=$(python -c "import json,sys; print(json.dumps({t: [{'layout': 'hopper_mma_xor'}] for t in sys.argv[1].split(',')}))" $1)
W=$(python -c "import json,sys; print(json.dumps({t: [{'layout': 'hopper_mma_xor'}] for t in sys.argv[1].split(',')}))" $2)
timeout 170 python benchmarks/gpu_check.py --quick --layout hopper_mma_xor --cases $3 --out $OUT/g 2>&1 | tail -4
timeout 200 python benchmarks/moe_bench.py --layout hopper_mma_rot --no-baselines --rounds 3 --shapes k3 --tokens $1 --compile-workers 4 --variants "$V" --out $OUT/k3 2>&1 | grep -E "layout=|copy bandwidth" 
timeout 190 python benchmarks/moe_bench.py --layout hopper_mma_rot --no-baselines --rounds 3 --shapes dsv3 --tokens $2 --compile-workers 4 --variants "$W" --out $OUT/dsv3 2>&1 | grep -E "layout=|copy bandwidth"
