"""The example models of Cavs §5, as library code the examples, the ``minicavs train``
command and the benchmarks import. Each is a :class:`minicavs.nn.Module` that owns its
parameters and its vertex function(s), and shares one small protocol:

    batch = model.prepare(samples)      # trees, sentences, rows or pairs -> a prepared batch
    loss = model.loss(batch)            # a scalar Tensor: the loss *summed* over the batch
    model.evaluate([batch, ...])        # {"loss": per target, ...accuracy or perplexity}

A prepared batch has ``num_samples`` (what throughput counts) and ``num_targets`` (what the
loss sums over). ``loss(batch, run=minicavs.vertex.evaluate_per_sample)`` evaluates the same
model vertex by vertex, the reference the batched runtime must match.
"""

from .tree_lstm import ChildSumTreeLSTMClassifier, TreeBatch, TreeClassifier, TreeLSTMClassifier
from .recursive_trees import RecursiveTreeLSTMClassifier, RNTNClassifier, TreeRNNClassifier
from .tree_fc import TreeFC, tree_fc_dataset
from .language_model import (FixedLSTMLanguageModel, SentenceBatch, StreamBatch,
                             VarLSTMLanguageModel, stream_rows)
from .seq2seq import PairBatch, Seq2Seq, reversal_task
from .td_tree_lstm import TDTreeLSTM, TopDownBatch

__all__ = ["TreeClassifier", "TreeBatch", "TreeLSTMClassifier", "ChildSumTreeLSTMClassifier",
           "TreeRNNClassifier", "RNTNClassifier", "RecursiveTreeLSTMClassifier",
           "TreeFC", "tree_fc_dataset", "VarLSTMLanguageModel", "FixedLSTMLanguageModel",
           "SentenceBatch", "StreamBatch", "stream_rows", "Seq2Seq", "PairBatch",
           "reversal_task", "TDTreeLSTM", "TopDownBatch"]
