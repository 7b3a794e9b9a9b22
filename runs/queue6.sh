#!/bin/bash
cd /work/wt-24e
BASE="--model rntn --task fine --leaf-loss --optimizer adagrad --lr 0.01 --batch-size 27 --init corenlp --loss-per sentence --adagrad-eps 1e-3 --adagrad-reset --l2 1e-3 --embed-l2 1e-4 --leaf-tanh --classifier-l2 1e-4 --hidden 25 --epochs 30 --tensor-lr 0.001"
runs/run.sh r4_el3e4_do3_s12 $BASE --embed-l2 3e-4 --dropout 0.3 --seed 1 --seeds 2
runs/run.sh r4_el3e4_s12 $BASE --embed-l2 3e-4 --seed 1 --seeds 2
runs/run.sh r4_do3_s12 $BASE --dropout 0.3 --seed 1 --seeds 2
