#!/bin/bash
# usage: runs/run.sh NAME ARGS... ; logs to runs/NAME.log (one run at a time)
name=$1; shift
cd /work/wt-24e
export PYTHONPATH=/work/wt-24e OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
echo "# $(date -u +%FT%TZ) git $(git rev-parse --short HEAD)$(git diff --quiet || echo +dirty)" > runs/$name.log
echo "# python examples/recursive_trees.py --data /work/shared/data/sst --threads 1 --no-progress $*" >> runs/$name.log
/usr/bin/time -f "# wall %e s" python examples/recursive_trees.py --data /work/shared/data/sst --threads 1 --no-progress "$@" >> runs/$name.log 2>&1
