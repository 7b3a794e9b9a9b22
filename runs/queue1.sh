#!/bin/bash
cd /work/wt-24e
while pgrep -f "r4_r1_tanh_d30_e25" >/dev/null; do sleep 2; done
FULL="--model rntn --task fine --leaf-loss --optimizer adagrad --lr 0.01 --batch-size 27 --init corenlp --loss-per sentence --adagrad-eps 1e-3 --l2 1e-3 --embed-l2 1e-4 --leaf-tanh --embed-l2-rows batch --classifier-l2 1e-4"
runs/run.sh r4_full_noreset_d25_e60 $FULL --hidden 25 --epochs 60
runs/run.sh r4_full_d30_e60 $FULL --adagrad-reset --hidden 30 --epochs 60
runs/run.sh r4_full_lr02_d25_e60 $FULL --adagrad-reset --lr 0.02 --hidden 25 --epochs 60
runs/run.sh r4_full_min2_d25_e60 $FULL --adagrad-reset --min-count 2 --hidden 25 --epochs 60
runs/run.sh r4_full_l2x3_d25_e60 $FULL --adagrad-reset --l2 3e-3 --hidden 25 --epochs 60
