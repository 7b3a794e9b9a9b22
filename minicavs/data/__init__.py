"""Datasets as trees and sentences: SST and PTB readers, generated tree shapes, and the
synthetic sentiment treebank the examples train on by default.

Pure NumPy and Python. Everything produces :class:`Tree` (vertices numbered children first,
root last, ready for ``InputGraph(children=tree.children)``) or int64 id arrays, with a
:class:`Vocabulary` mapping tokens to ids (``<unk>`` = 0).
"""

from .batches import minibatches
from .tree import DataError, Tree, TreebankSplits
from .vocab import Vocabulary
from .sst import (SST_TASKS, binary_accuracy, binary_labels, fine_grained_accuracy, load_sst,
                  parse_tree, phrase_accuracy, polarity, read_sst, rebuild_vocabulary,
                  root_labels, sst_task, ternary_labels, ternary_polarity, to_binary)
from .vectors import load_word_vectors
from .ptb import EOS, PTBCorpus, batch_sentences, load_ptb, pad_batch, read_ptb
from .trees import (chain_tree, complete_binary_tree, random_binary_tree, random_nary_tree,
                    random_tree)
from .synthetic import make_splits, synthetic_labels, synthetic_treebank, synthetic_vocabulary

__all__ = [
    "minibatches", "DataError", "Tree", "TreebankSplits", "Vocabulary",
    "parse_tree", "read_sst", "load_sst", "root_labels", "to_binary", "fine_grained_accuracy",
    "binary_accuracy", "binary_labels", "SST_TASKS", "sst_task", "polarity", "phrase_accuracy",
    "ternary_labels", "ternary_polarity",
    "rebuild_vocabulary", "load_word_vectors",
    "EOS", "PTBCorpus", "read_ptb", "load_ptb", "batch_sentences", "pad_batch",
    "complete_binary_tree", "random_binary_tree", "random_nary_tree", "chain_tree", "random_tree",
    "synthetic_treebank", "synthetic_labels", "synthetic_vocabulary", "make_splits",
]
