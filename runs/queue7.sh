#!/bin/bash
cd /work/wt-24e
while pgrep -f "queue6.sh" >/dev/null; do sleep 2; done
BASE="--model rntn --leaf-loss --optimizer adagrad --lr 0.01 --batch-size 27 --init corenlp --loss-per sentence --adagrad-eps 1e-3 --adagrad-reset --l2 1e-3 --embed-l2 3e-4 --leaf-tanh --classifier-l2 1e-4 --hidden 25 --epochs 30 --tensor-lr 0.001 --dropout 0.3"
runs/run.sh r4_binary_el3e4_do3 $BASE --task binary --seeds 3
