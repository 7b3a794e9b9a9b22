#!/bin/bash
# The checks a lent GPU runs, in one call (developers' guide: "A GPU, when one is lent").
# Each step has its own time limit, so a hang in one leaves time for the others; logs go to
# $OUT (or ./gpu-check). Data: DATA=<folder with sst/train.txt and tags/> (else synthetic).
# The whole script took 4.5 minutes on an H200 (session 19, before the warm-cache step, about
# 40 s; a serial pytest -m gpu alone takes over 140 s, 30 s on 8 workers). The steps' limits add
# up to more than BUDGET: they are ceilings for a hang, most steps take a fraction of theirs.
OUT=${OUT:-gpu-check}; mkdir -p "$OUT"; export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
DATA=${DATA:-}; SST=${DATA:+--sst $DATA/sst/train.txt}
# BUDGET: seconds for the whole script (default 540, inside the device tool's 600 a call; a lent
# machine has 15 minutes in all, its start included): each step's limit is cut to what is left,
# and a step with under 15 s left is skipped and said so, so the call returns with every log.
BUDGET=${BUDGET:-540}
step() { local name=$1 limit=$2; shift 2; local left=$((BUDGET - SECONDS))
         if [ "$left" -lt 15 ]; then echo "=== $name: skipped (${left}s of BUDGET=${BUDGET}s left)"
                                     return; fi
         [ "$limit" -gt "$left" ] && limit=$left
         echo "=== $name (limit ${limit}s)"; local t0=$SECONDS
         timeout "$limit" "$@" >"$OUT/$name.log" 2>&1; local rc=$?
         echo "=== $name: rc=$rc in $((SECONDS - t0))s"; tail -n "${TAIL:-25}" "$OUT/$name.log"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import cupy, numpy; print('cupy', cupy.__version__, 'numpy', numpy.__version__)"
WORKERS=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8")
step doctor 30 python3 -m minicavs doctor
step pytest_gpu ${PYTEST_LIMIT:-120} python3 -m pytest -q -p no:cacheprovider -m gpu $WORKERS \
     --maxfail 25 --timeout 100 -o addopts= tests
step host_costs 40 python3 benchmarks/cuda_host_costs.py
# Who issued each model's levels on this GPU (C, or Python and why: explain()'s backends).
step issued 60 python3 benchmarks/cuda_launches.py --steps 2 --size 64
# The goal's workload on the whole SST training set, the others on its first 2,048 trees.
step bench_cuda ${BENCH_LIMIT:-80} python3 benchmarks/run.py --cuda --epochs 1 --ablation none \
     --workloads tree_lstm_256 --timeout 75 $SST --out "$OUT/tree_lstm_256"
# The level loops issued from Python as before the C issuer (session 20, cuda/issuer.py): the
# same epoch, so the two issuers' ratio comes from one machine.
step bench_cuda_python_issuer ${BENCH_LIMIT:-80} env MINICAVS_CUDA_ISSUER=python python3 \
     benchmarks/run.py --cuda --epochs 1 --ablation none --workloads tree_lstm_256 \
     --systems minicavs-cuda --timeout 75 $SST --out "$OUT/tree_lstm_256_python_issuer"
# The same again in a new process: CuPy's compile cache on disk is warm now, so what is left of
# the first epoch's excess is not compiling (session 19: 1.69x a later epoch, against 3.10x cold).
step bench_cuda_warm ${BENCH_LIMIT:-80} python3 benchmarks/run.py --cuda --epochs 1 --ablation none \
     --workloads tree_lstm_256 --systems minicavs-cuda --timeout 75 $SST --out "$OUT/tree_lstm_256_warm"
step bench_cuda_rest ${REST_LIMIT:-150} python3 benchmarks/run.py --cuda --epochs 1 \
     --ablation none --workloads "${WORKLOADS:-tree_lstm,tree_fc,var_lstm,tree_rnn,rntn}" \
     --size 2048 --timeout 60 $SST --out "$OUT/rest"
step main_cuda 45 python3 -m minicavs train tree-lstm --device cuda --no-progress
step main_cpu 30 python3 -m minicavs train tree-lstm --device cpu --no-progress
step autobatch_table ${TABLE_LIMIT:-150} python3 benchmarks/autobatch_table.py --cuda --batches 3 \
     --rounds 1 --threads "$(nproc)" ${DATA:+--data $DATA} ${TABLE_ARGS:---systems \
     minicavs-agenda:cuda,minicavs-agenda+:cuda,minicavs-agenda+,minicavs-vertex:cuda}
# The autobatched tagger's phases with its batches issued from C (session 24,
# autobatch/launches.py) and from the interpreter, and how long the host waits for the device
# at a step's end: the issuers' ratio on one machine (emulated: host 30-33 against 45-53 ms).
step phases_cuda 90 bash -c "for i in c python; do echo issuer \$i; MINICAVS_CUDA_ISSUER=\$i \
     python3 benchmarks/autobatch_phases.py tagger --device cuda --strategy agenda+ --batches 6 \
     ${DATA:+--data $DATA}; done"
# Host- or device-bound, and which kernels: the device's busy time per step (PyTorch's profiler
# sees every kernel of the process) against the step's time (session 19 on an H200: 6-13 % busy
# for every workload, so the host sets the pace).
step cuda_profile 100 python3 benchmarks/cuda_profile.py --workloads "${PROFILE_WORKLOADS:-tree_fc,\
var_lstm,tree_lstm_256,autobatch:tagger:agenda,autobatch:tagger:agenda+,autobatch:treelstm:agenda,\
autobatch:treelstm:agenda+}" $SST ${DATA:+--data $DATA}
