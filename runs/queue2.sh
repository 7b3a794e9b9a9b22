#!/bin/bash
cd /work/wt-24e
while pgrep -f "queue1.sh" >/dev/null; do sleep 2; done
FULL="--model rntn --task fine --leaf-loss --optimizer adagrad --lr 0.01 --batch-size 27 --init corenlp --loss-per sentence --adagrad-eps 1e-3 --adagrad-reset --l2 1e-3 --embed-l2 1e-4 --leaf-tanh --embed-l2-rows batch --classifier-l2 1e-4"
runs/run.sh r4_full_tlr001_d25_e60 $FULL --tensor-lr 0.001 --hidden 25 --epochs 60
runs/run.sh r4_rnn_full_d25_e30 ${FULL/--model rntn/--model treernn} --hidden 25 --epochs 30
runs/run.sh r4_full_tlr003_d25_e60 $FULL --tensor-lr 0.003 --hidden 25 --epochs 60
