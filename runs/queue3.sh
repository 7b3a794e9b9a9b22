#!/bin/bash
cd /work/wt-24e
while pgrep -f "r4_full_tlr001_d25_e60" >/dev/null; do sleep 2; done
BASE="--model rntn --task fine --leaf-loss --optimizer adagrad --lr 0.01 --batch-size 27 --init corenlp --loss-per sentence --adagrad-eps 1e-3 --adagrad-reset --l2 1e-3 --embed-l2 1e-4 --leaf-tanh --classifier-l2 1e-4 --hidden 25 --epochs 30"
runs/run.sh r4_tlr001_allrows_e30 $BASE --tensor-lr 0.001
runs/run.sh r4_rnn_full_d25_e30 ${BASE/--model rntn/--model treernn} --embed-l2-rows batch
runs/run.sh r4_tlr003_e30 $BASE --embed-l2-rows batch --tensor-lr 0.003
runs/run.sh r4_tlr001_el2e3_e30 $BASE --embed-l2-rows batch --tensor-lr 0.001 --embed-l2 1e-3
