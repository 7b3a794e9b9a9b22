#!/bin/bash
# The checks a lent GPU runs, in one call (developers' guide: "A GPU, when one is lent").
# Each step has its own time limit, so a hang in one leaves time for the others; logs go to
# $OUT (or ./gpu-check). Data: DATA=<folder with sst/train.txt and tags/> (else synthetic).
OUT=${OUT:-gpu-check}; mkdir -p "$OUT"; export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
DATA=${DATA:-}; SST=${DATA:+--sst $DATA/sst/train.txt}
step() { local name=$1 limit=$2; shift 2; echo "=== $name (limit ${limit}s)"; local t0=$SECONDS
         timeout "$limit" "$@" >"$OUT/$name.log" 2>&1; local rc=$?
         echo "=== $name: rc=$rc in $((SECONDS - t0))s"; tail -n "${TAIL:-25}" "$OUT/$name.log"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import cupy, numpy; print('cupy', cupy.__version__, 'numpy', numpy.__version__)"
step doctor 30 python3 -m minicavs doctor
step pytest_gpu ${PYTEST_LIMIT:-180} python3 -m pytest -q -p no:cacheprovider -m gpu --maxfail 25 \
     --timeout 120 -o addopts= tests
step host_costs 40 python3 benchmarks/cuda_host_costs.py
step bench_cuda ${BENCH_LIMIT:-150} python3 benchmarks/run.py --cuda --epochs 1 --ablation none \
     --workloads "${WORKLOADS:-tree_lstm_256}" --timeout 140 $SST --out "$OUT"
step autobatch_table ${TABLE_LIMIT:-150} python3 benchmarks/autobatch_table.py --cuda --batches 4 \
     --rounds 1 --threads "$(nproc)" ${TABLE_ARGS:-}
step autobatch_cuda 50 python3 examples/autobatch.py --device cuda --train-size 1000 \
     --test-size 200 --epochs 1 --no-progress
step autobatch_cpu 40 python3 examples/autobatch.py --device cpu --train-size 1000 \
     --test-size 200 --epochs 1 --no-progress
# Where a Tree-LSTM-256 epoch's host time goes (the GPU idles while Python issues launches).
[ "${PROFILE:-1}" = 0 ] && exit 0
step profile_treelstm_cuda 90 python3 -m cProfile -o "$OUT/treelstm.prof" examples/tree_lstm.py \
     --device cuda --hidden 256 --embed-dim 256 --train-size 3000 --epochs 2 --no-progress \
     ${DATA:+--data $DATA/sst}
python3 -c "import pstats, sys; pstats.Stats(sys.argv[1]).sort_stats('tottime').print_stats(30)" \
     "$OUT/treelstm.prof" | tail -n 40; rm -f "$OUT/treelstm.prof"
