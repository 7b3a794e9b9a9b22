"""The papers' training details the SST examples offer as options: rare words to <unk>
(--min-count), word dropout, the loss per sentence, AdaGrad's eps and per-epoch reset,
plain SGD on the embeddings (a CombinedOptimizer) and Socher et al.'s starting weights.
Steps are checked against values computed here by hand; all data is written here."""

import argparse

import numpy as np
import pytest

import minicavs as mc
from minicavs.data import (DataError, TreebankSplits, Vocabulary, load_sst, parse_tree,
                           rebuild_vocabulary)
from minicavs.errors import ArgumentError, CheckpointError
from minicavs.models import TreeLSTMClassifier, TreeRNNClassifier
from minicavs.models import recursive_trees
from minicavs.nn import SGD, Adagrad, CombinedOptimizer, Module, Parameter, save_checkpoint
from minicavs.training import fit, make_optimizer, train_epoch

LINES = ["(3 (2 (2 The) (2 film)) (4 (2 is) (4 (3 very) (4 good))))",
         "(1 (2 (2 The) (2 plot)) (1 (2 is) (0 (1 dull) (2 .))))",
         "(2 (2 It) (2 (2 was) (2 long)))"]
# Training counts: The 2, is 2, every other word once.


def _splits():
    vocab = Vocabulary.build(parse_tree(line).tokens for line in LINES)
    trees = [parse_tree(line, vocab) for line in LINES]
    return TreebankSplits(trees, trees[:2], trees[1:], vocab)


def test_min_count_maps_the_rare_training_words_to_unk():
    splits = rebuild_vocabulary(_splits(), min_count=2)
    assert splits.vocab.tokens == ["<unk>", "The", "is"]  # by count, then alphabetically
    first = splits.train[0]  # The film is very good
    assert first.words[first.leaves()].tolist() == [1, 0, 2, 0, 0]
    assert splits.dev[0].words[splits.dev[0].leaves()].tolist() == [1, 0, 2, 0, 0]
    assert first.labels.tolist() == _splits().train[0].labels.tolist()
    assert rebuild_vocabulary(_splits(), 1).vocab == _splits().vocab
    for bad in (0, 1.5, True):
        with pytest.raises(DataError, match="min_count must be an integer >= 1"):
            rebuild_vocabulary(_splits(), bad)


def test_load_sst_builds_its_vocabulary_with_min_count(tmp_path):
    (tmp_path / "train.txt").write_text("\n".join(LINES) + "\n")
    (tmp_path / "dev.txt").write_text(LINES[2] + "\n")
    (tmp_path / "test.txt").write_text("(2 (2 The) (2 unseen))\n")
    splits = load_sst(tmp_path, min_count=2)
    assert len(splits.vocab) == 3 and splits.dev[0].words.max() == 0  # It was long: all rare
    assert splits.test[0].words[splits.test[0].leaves()].tolist() == [1, 0]


def _leaf_batch(num_trees=400):
    """``num_trees`` copies of one 5-word tree: 2,000 leaves, every word known."""
    splits = _splits()
    return splits, splits.train[:1] * num_trees


def test_word_dropout_replaces_words_by_unk_in_training_only():
    splits, trees = _leaf_batch()
    model = TreeRNNClassifier(len(splits.vocab), hidden=3, word_dropout=0.3)
    batch = model.prepare(trees)
    original = batch.words.numpy().copy()
    leaves = original[:, 0] >= 0
    mc.seed(7)
    dropped = model.words(batch).numpy()[:, 0]
    assert np.array_equal(batch.words.numpy(), original)  # the batch keeps its ids
    assert np.all(dropped[~leaves] == -1)  # internal vertices have no word to drop
    changed = dropped[leaves] != original[leaves, 0]
    assert np.all(dropped[leaves][changed] == Vocabulary.UNK_ID)
    assert 0.25 < changed.mean() < 0.35  # 2,000 leaves: p = 0.3 within 5 points
    mc.seed(7)
    assert np.array_equal(model.words(batch).numpy()[:, 0], dropped)  # the seed decides
    model.eval()
    assert np.array_equal(model.words(batch).numpy(), original)


def test_word_dropout_trains_the_unk_vector():
    splits, trees = _leaf_batch(20)
    for p, unk_trained in ((0.0, False), (0.5, True)):
        mc.seed(1)
        model = TreeRNNClassifier(len(splits.vocab), hidden=3, leaf_loss=True, word_dropout=p)
        model.train()
        model.loss(model.prepare(trees)).backward()
        assert bool(np.any(model.embedding.weight.grad.numpy()[0] != 0)) == unk_trained


def test_word_dropout_out_of_range_is_refused():
    with pytest.raises(ArgumentError, match="word_dropout"):
        TreeLSTMClassifier(5, embed_dim=2, hidden=2, word_dropout=1.0)


class _Counted(Module):
    """loss = sum(w) * 6 over a batch of 3 samples and 6 targets: its gradient per target is
    1, per sample 2."""

    class Batch:
        num_targets, num_samples = 6, 3

    def __init__(self):
        self.w = Parameter(np.zeros(1))

    def prepare(self, samples):
        return self.Batch()

    def loss(self, batch):
        return mc.sum(self.w) * 6.0


@pytest.mark.parametrize("loss_per, step", [("target", 1.0), ("sample", 2.0)])
def test_the_step_divides_the_loss_per_target_or_per_sample(loss_per, step):
    model = _Counted()
    stats = train_epoch(model, SGD(model.parameters(), lr=1.0), [[0, 1, 2]], progress=False,
                        loss_per=loss_per)
    assert model.w.data.tolist() == [-step]
    assert stats.loss == 0.0  # reported per target either way: 0 * 6 / 6
    with pytest.raises(ArgumentError, match="loss_per must be one of"):
        train_epoch(model, SGD(model.parameters(), lr=1.0), [[0]], loss_per="tree")


def test_adagrad_reset_state_makes_the_next_step_a_first_step():
    p = Parameter(np.array([0.0]))
    optimizer = Adagrad([p], lr=0.1, eps=0.0)
    for _ in range(3):  # steps of 0.1 / sqrt(k) for gradient 1
        p.grad = mc.tensor(np.array([1.0]))
        optimizer.step()
    before = p.data[0]
    assert before == pytest.approx(-0.1 * (1 + 1 / np.sqrt(2) + 1 / np.sqrt(3)))
    optimizer.reset_state()
    p.grad = mc.tensor(np.array([1.0]))
    optimizer.step()
    assert p.data[0] == pytest.approx(before - 0.1)


def test_adagrad_eps_shrinks_the_steps_of_small_gradients():
    """CoreNLP's eps 1e-3: a gradient of 1e-3 takes half a step, not a whole one."""
    p = Parameter(np.array([0.0]))
    optimizer = Adagrad([p], lr=0.1, eps=1e-3)
    p.grad = mc.tensor(np.array([1e-3]))
    optimizer.step()
    assert p.data[0] == pytest.approx(-0.05)


def test_fit_calls_on_epoch_start_before_each_epoch():
    model, seen = _Counted(), []
    model.evaluate = lambda batches: {"loss": 0.0}
    fit(model, SGD(model.parameters(), lr=1.0), [0], None, epochs=3, batch_size=1,
        progress=False, log=lambda line: None,
        on_epoch_start=lambda epoch: seen.append((epoch, model.w.data[0])))
    assert seen == [(1, 0.0), (2, -1.0), (3, -2.0)]


def test_combined_optimizer_steps_each_part_by_its_own_rule():
    a, b = Parameter(np.array([1.0])), Parameter(np.array([1.0]))
    combined = CombinedOptimizer([Adagrad([a], lr=0.1, eps=0.0), SGD([b], lr=0.1)])
    assert combined.params == [a, b] and len(combined.param_groups) == 2
    for _ in range(2):
        a.grad, b.grad = mc.tensor(np.array([0.5])), mc.tensor(np.array([0.5]))
        combined.step()
    assert a.data[0] == pytest.approx(1 - 0.1 - 0.1 / np.sqrt(2))  # AdaGrad: 0.1, 0.1/√2
    assert b.data[0] == pytest.approx(1 - 2 * 0.05)  # SGD: lr * g twice
    combined.zero_grad()
    assert a.grad is None and b.grad is None
    state = combined.state_dict()
    fresh = CombinedOptimizer([Adagrad([a], lr=0.1, eps=0.0), SGD([b], lr=0.1)])
    fresh.load_state_dict(state)
    assert np.array_equal(fresh.optimizers[0].state[0]["sum"], [0.5])
    combined.reset_state()
    assert combined.optimizers[0].state == [{}]


def test_combined_optimizer_refuses_shared_parameters_bad_states_and_checkpoints(tmp_path):
    a = Parameter(np.array([1.0]))
    with pytest.raises(ArgumentError, match="optimiser 1 updates a parameter"):
        CombinedOptimizer([SGD([a], lr=0.1), SGD([a], lr=0.1)])
    with pytest.raises(ArgumentError, match="non-empty list of minicavs optimisers"):
        CombinedOptimizer([])
    combined = CombinedOptimizer([SGD([a], lr=0.1)])
    with pytest.raises(CheckpointError, match="expected the state of a CombinedOptimizer of 1"):
        combined.load_state_dict({"type": "CombinedOptimizer", "parts": []})
    with pytest.raises(CheckpointError, match="expected the state of a CombinedOptimizer of 1"):
        combined.load_state_dict(["not", "a", "state"])  # (not a dict at all)
    with pytest.raises(CheckpointError, match="optimiser 0: the state is for optimiser"):
        combined.load_state_dict({"type": "CombinedOptimizer",
                                  "parts": [Adagrad([a]).state_dict()]})
    model = TreeRNNClassifier(5, hidden=2)
    with pytest.raises(CheckpointError, match="got CombinedOptimizer"):
        save_checkpoint(tmp_path / "c.npz", model,
                        CombinedOptimizer([SGD(model.parameters(), lr=0.1)]))


def _args(**settings):
    base = dict(optimizer="adagrad", lr=0.05, embed_lr=0.1, l2=1e-4, embed_l2=0.0,
                adagrad_eps=1e-3, embed_optimizer="same")
    return argparse.Namespace(**dict(base, **settings))


def test_make_optimizer_gives_the_embeddings_plain_sgd_on_request():
    model = TreeRNNClassifier(10, hidden=3)
    optimizer = make_optimizer(_args(embed_optimizer="sgd"), model)
    adagrad, sgd = optimizer.optimizers
    assert isinstance(adagrad, Adagrad) and isinstance(sgd, SGD)
    assert adagrad.eps == 1e-3 and adagrad.lr == 0.05 and len(adagrad.params) == 4
    assert sgd.params == [model.embedding.weight] and sgd.lr == 0.1
    same = make_optimizer(_args(), model)
    assert isinstance(same, Adagrad) and same.eps == 1e-3 and len(same.param_groups) == 2


def test_corenlp_init_starts_a_parent_near_the_sum_of_its_children():
    H, C = 6, 5
    mc.seed(3)
    model = recursive_trees.make("rntn", 50, H, init="corenlp")
    W = model.W.numpy()
    noise = 1 / (2 * np.sqrt(H))
    identity = np.concatenate([np.eye(H), np.eye(H)])
    assert W.shape == (2 * H, H) and np.all(np.abs(W - identity) <= noise)
    assert np.all(model.b.numpy() == 0)
    assert np.all((model.b_out.numpy() >= 0) & (model.b_out.numpy() < 1))
    assert np.all(np.abs(model.W_out.numpy()) <= 1 / np.sqrt(H)) and model.W_out.shape == (H, C)
    table = model.embedding.weight.numpy()
    assert 0.08 < table.std() < 0.12  # N(0, 0.1²), 300 values
    mc.seed(3)
    again = recursive_trees.make("rntn", 50, H, init="corenlp")
    assert np.array_equal(again.W.numpy(), W) and np.array_equal(again.V.numpy(),
                                                                  model.V.numpy())


def test_an_unknown_init_or_one_the_model_lacks_is_refused():
    with pytest.raises(ArgumentError, match="init must be one of"):
        recursive_trees.make("treernn", 5, 2, init="glorot")
    with pytest.raises(ArgumentError, match="the Tree-LSTM has only 'xavier'"):
        recursive_trees.make("treelstm", 5, 2, init="corenlp")
    with pytest.raises(ArgumentError, match="unknown model 'lstm'"):
        recursive_trees.make("lstm", 5, 2)


@pytest.mark.parametrize("leaf_tanh", [False, True])
def test_the_rntn_composes_as_socher_et_al_write_it(leaf_tanh):
    """h = tanh(xᵀ V[i] x + x W + b) with x = [h_l; h_r], computed here with NumPy; a leaf is
    its word vector, or with leaf_tanh (CoreNLP's) tanh of it."""
    splits = _splits()
    model = recursive_trees.make("rntn", len(splits.vocab), 3, dtype="float64",
                                 leaf_tanh=leaf_tanh)
    with mc.no_grad():  # word vectors past tanh's linear range, so the two differ
        model.embedding.weight.data = model.embedding.weight.data * 20
    tree = splits.train[1]  # The plot is dull .
    batch = model.prepare([tree])
    with mc.no_grad():
        states = model.states(batch).numpy()
    table, V = model.embedding.weight.numpy(), model.V.numpy()
    W, b = model.W.numpy(), model.b.numpy()
    h = {}
    for v in range(tree.num_vertices):
        kids = tree.children[v]
        if not kids:
            h[v] = np.tanh(table[tree.words[v]]) if leaf_tanh else table[tree.words[v]]
        else:
            x = np.concatenate([h[kids[0]], h[kids[1]]])
            h[v] = np.tanh(np.einsum("j,ijk,k->i", x, V, x) + x @ W + b)
    assert batch.graphs.num_vertices == tree.num_vertices  # one tree keeps its numbering
    assert np.allclose(states, np.stack([h[v] for v in range(tree.num_vertices)]),
                       rtol=1e-12, atol=1e-12)


def test_leaf_tanh_bounds_the_treernn_leaves_and_is_refused_for_the_tree_lstm():
    splits = _splits()
    model = recursive_trees.make("treernn", len(splits.vocab), 3, dtype="float64",
                                 leaf_tanh=True)
    model.embedding.weight.data = model.embedding.weight.data * 50
    batch = model.prepare([splits.train[0]])
    with mc.no_grad():
        states = model.states(batch).numpy()
    leaves = splits.train[0].leaves()
    table = model.embedding.weight.numpy()
    assert np.allclose(states[leaves], np.tanh(table[splits.train[0].words[leaves]]))
    with pytest.raises(ArgumentError, match="leaf_tanh is the TreeRNN's and the RNTN's"):
        recursive_trees.make("treelstm", 5, 2, leaf_tanh=True)


def test_active_rows_l2_penalises_only_the_word_vectors_a_step_used():
    """CoreNLP's L2 on the word vectors covers the batch's words only: an absent word keeps
    its vector under AdaGrad, where a penalty on the whole table would shrink it."""
    from minicavs.training import ActiveRowsL2

    table = Parameter(np.arange(12.0).reshape(4, 3) + 1.0)
    grad = np.zeros((4, 3))
    grad[1] = [0.5, 0.0, -0.5]
    grad[3] = [0.0, 0.0, 1e-3]
    table.grad = mc.Tensor(grad.copy())
    before = table.grad
    ActiveRowsL2(table, 0.1)(None)
    expected = grad.copy()
    expected[[1, 3]] += 0.1 * table.numpy()[[1, 3]]
    assert np.allclose(table.grad.numpy(), expected)
    assert np.array_equal(before.numpy(), grad)  # the old gradient is not changed in place
    start = table.numpy().copy()
    optimizer = Adagrad([table], lr=0.01, eps=1e-3)
    optimizer.step()
    assert np.array_equal(table.numpy()[[0, 2]], start[[0, 2]])
    assert not np.allclose(table.numpy()[[1, 3]], start[[1, 3]])
    with pytest.raises(ArgumentError):
        ActiveRowsL2(table, -1.0)


def test_make_optimizer_gives_the_classifier_and_the_batch_s_words_their_own_l2():
    model = TreeRNNClassifier(10, hidden=3)
    optimizer = make_optimizer(_args(l2=1e-3, classifier_l2=1e-4, embed_l2=1e-4,
                                     embed_l2_rows="batch"), model)
    decay = {id(p): g["weight_decay"] for g in optimizer.param_groups for p in g["params"]}
    assert decay[id(model.W)] == decay[id(model.b)] == 1e-3
    assert decay[id(model.W_out)] == 1e-4 and decay[id(model.b_out)] == 0.0
    assert decay[id(model.embedding.weight)] == 0.0  # ActiveRowsL2 penalises it instead
    plain = make_optimizer(_args(l2=1e-3, embed_l2=1e-4), model)
    decay = {id(p): g["weight_decay"] for g in plain.param_groups for p in g["params"]}
    assert decay[id(model.W_out)] == decay[id(model.b_out)] == 1e-3
    assert decay[id(model.embedding.weight)] == 1e-4


def test_make_optimizer_gives_the_rntn_tensor_its_own_l2_and_learning_rate():
    model = recursive_trees.make("rntn", 10, 3)
    optimizer = make_optimizer(_args(l2=1e-3, tensor_l2=1e-2, tensor_lr=0.002), model)
    groups = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    assert groups[id(model.V)]["weight_decay"] == 1e-2 and groups[id(model.V)]["lr"] == 0.002
    assert groups[id(model.W)]["weight_decay"] == 1e-3 and groups[id(model.W)]["lr"] == 0.05
    only_lr = make_optimizer(_args(l2=1e-3, tensor_lr=0.002), model)
    groups = {id(p): g for g in only_lr.param_groups for p in g["params"]}
    assert groups[id(model.V)]["weight_decay"] == 1e-3 and groups[id(model.V)]["lr"] == 0.002


def test_lr_decay_multiplies_every_learning_rate_after_the_first_epoch():
    from minicavs.training import _epoch_start

    model = recursive_trees.make("rntn", 10, 3)
    optimizer = make_optimizer(_args(embed_optimizer="sgd", tensor_lr=0.002, lr_decay=0.5,
                                     adagrad_reset=True), model)
    start = _epoch_start(_args(lr_decay=0.5, adagrad_reset=True), optimizer)
    adagrad, sgd = optimizer.optimizers
    seen = []
    for epoch in (1, 2, 3):
        start(epoch)
        seen.append(sorted(g["lr"] for g in adagrad.param_groups) + [sgd.param_groups[0]["lr"]])
    assert seen[0] == [0.002, 0.05, 0.1]  # the first epoch at the given rates
    np.testing.assert_allclose(seen[1], [0.001, 0.025, 0.05])
    np.testing.assert_allclose(seen[2], [0.0005, 0.0125, 0.025])
    assert _epoch_start(_args(), optimizer) is None  # neither option: nothing to do
    parser = argparse.ArgumentParser()
    from minicavs.training import add_sst_arguments
    add_sst_arguments(parser)
    assert parser.parse_args([]).lr_decay == 1.0
    for bad in ("0", "1.5", "-0.1"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--lr-decay", bad])
