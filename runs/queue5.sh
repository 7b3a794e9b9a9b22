#!/bin/bash
cd /work/wt-24e
while pgrep -f "queue4.sh" >/dev/null; do sleep 2; done
BASE="--model rntn --task fine --leaf-loss --optimizer adagrad --lr 0.01 --batch-size 27 --init corenlp --loss-per sentence --adagrad-eps 1e-3 --adagrad-reset --l2 1e-3 --embed-l2 1e-4 --leaf-tanh --classifier-l2 1e-4 --hidden 25 --epochs 30"
runs/run.sh r4_tlr001_allrows_el3e4_do3_e30 $BASE --tensor-lr 0.001 --embed-l2 3e-4 --dropout 0.3
