"""Benchmarks of the Cavs evaluation (Table 1, Figs. 8-10): minicavs against PyTorch (eager and
hand-batched) and DyNet (autobatching) on Tree-LSTM, Tree-FC and Var-LSTM training.

``python benchmarks/run.py --quick`` for a smoke run; see benchmarks/README.md. Nothing in the
library or its tests imports this package, and torch, dynet and matplotlib are needed only here.
"""
