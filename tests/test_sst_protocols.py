"""The SST papers' protocols and training settings: the binary task's filtering and 2-class
scoring, phrase accuracy, keeping the best dev epoch, dropout only in training, AdaGrad and
clipping against hand-computed steps, GloVe vectors, and language-model perplexity with <eos>.
All on tiny data written here (the real SST folder is not needed)."""

import argparse
import math

import numpy as np
import pytest

import minicavs as mc
from minicavs.data import (DataError, TreebankSplits, Vocabulary, binary_accuracy,
                           binary_labels, load_word_vectors, parse_tree, phrase_accuracy,
                           polarity, sst_task, ternary_labels, ternary_polarity)
from minicavs.models import (FixedLSTMLanguageModel, TreeLSTMClassifier, TreeRNNClassifier,
                             VarLSTMLanguageModel)
from minicavs.models.language_model import stream_rows
from minicavs.nn import SGD, Adagrad, Module, Parameter, clip_grad_norm
from minicavs.errors import ArgumentError
from minicavs.training import (add_sst_arguments, best_epoch, fit, make_optimizer,
                               mean_and_std, sentiment_experiment)
from minicavs.vertex import evaluate_per_sample

LINES = ["(3 (2 (2 The) (2 film)) (4 (2 is) (4 (3 very) (4 good))))",
         "(2 (2 It) (2 (2 was) (2 long)))",  # neutral: gone from the binary task
         "(1 (2 (2 The) (2 plot)) (1 (2 is) (0 (1 dull) (2 .))))"]


def _splits():
    vocab = Vocabulary.build(parse_tree(line).tokens for line in LINES)
    trees = [parse_tree(line, vocab) for line in LINES]
    return TreebankSplits(trees, trees[:2], trees[1:], vocab)


def test_binary_task_drops_neutral_sentences_and_unlabels_neutral_phrases():
    splits = _splits()
    binary = sst_task(splits, "binary")
    assert [len(binary.train), len(binary.dev), len(binary.test)] == [2, 1, 1]
    assert binary.vocab is splits.vocab
    # "(3 (2 (2 The) (2 film)) (4 (2 is) (4 (3 very) (4 good))))", vertices in post-order:
    # The film (The film) is very good (very good) (is very good) root
    assert binary.train[0].labels.tolist() == [-1, -1, -1, -1, 1, 1, 1, 1, 1]
    assert binary.train[1].labels[-1] == 0 and binary.test[0] is not splits.test[1]
    assert binary.train[0].children == splits.train[0].children
    assert binary_labels([0, 1, 2, 3, 4, -1]).tolist() == [0, 0, -1, 1, 1, -1]
    assert sst_task(splits, "fine") is splits
    with pytest.raises(DataError, match="unknown SST task 'ternary'"):
        sst_task(splits, "ternary")


def test_binary3_keeps_the_binary_sentences_with_three_labels_on_every_phrase():
    splits = _splits()
    ternary = sst_task(splits, "binary3")
    assert [len(ternary.train), len(ternary.dev), len(ternary.test)] == [2, 1, 1]
    # the same first tree as above: the neutral phrases are now class 1, not unlabelled
    assert ternary.train[0].labels.tolist() == [1, 1, 1, 1, 2, 2, 2, 2, 2]
    # "(1 (2 (2 The) (2 plot)) (1 (2 is) (0 (1 dull) (2 .))))": dull 1 -> 0, 0 -> 0, root 1 -> 0
    assert ternary.train[1].labels.tolist() == [1, 1, 1, 1, 0, 1, 0, 0, 0]
    assert ternary_labels([0, 1, 2, 3, 4, -1]).tolist() == [0, 0, 1, 2, 2, -1]
    with pytest.raises(mc.IndexRangeError, match="labels holds label 5"):
        ternary_labels([5])


def test_ternary_polarity_compares_negative_and_positive_outputs_only():
    scores = [[0.3, 0.6, 0.1],   # neutral argmax, negative beats positive
              [-2.0, 0.0, -1.0],  # log-probabilities: positive
              [0.2, 0.6, 0.2]]   # a tie goes to positive, as in Tai et al.'s predict
    assert ternary_polarity(scores).tolist() == [0, 1, 1]
    with pytest.raises(mc.ShapeError, match=r"expected \(n, 3\) class scores"):
        ternary_polarity(np.zeros((2, 5)))


def test_a_three_class_model_scores_roots_negative_against_positive():
    ternary = sst_task(_splits(), "binary3")
    model = TreeRNNClassifier(len(ternary.vocab), hidden=3, num_classes=3, leaf_loss=True)
    model.W_out.data[...] = 0.0
    model.b_out.data[...] = np.array([0.0, 5.0, 1.0], np.float32)  # neutral, then positive
    result = model.evaluate([model.prepare(ternary.train)])
    assert model.root_metric == "binary"
    assert result["binary"] == 0.5  # every root called positive: one of the two is
    labelled = np.concatenate([t.labels for t in ternary.train])
    assert result["phrase"] == pytest.approx(np.mean(labelled == 1))  # phrases: argmax
    assert "fine" not in result


def test_polarity_compares_positive_and_negative_mass_ignoring_neutral():
    probabilities = [[0.1, 0.2, 0.6, 0.05, 0.05],  # neutral argmax, negative mass wins
                     [0.0, 0.1, 0.5, 0.2, 0.2],    # positive mass wins
                     [0.3, 0.0, 0.1, 0.0, 0.6]]    # argmax 4 and positive
    assert polarity(probabilities).tolist() == [0, 1, 1]
    gold = [3, 4, 2]  # the neutral sentence is not scored; the first is wrong
    assert binary_accuracy(polarity(probabilities), gold, predicted_classes=2) == 0.5


def test_phrase_accuracy_counts_every_labelled_vertex():
    assert phrase_accuracy([0, 1, 1, 4, 2], [0, 1, 2, -1, 2]) == pytest.approx(3 / 4)
    assert math.isnan(phrase_accuracy([1], [-1]))


def test_a_two_class_model_is_scored_on_roots_and_phrases():
    binary = sst_task(_splits(), "binary")
    model = TreeRNNClassifier(len(binary.vocab), hidden=3, num_classes=2, leaf_loss=True)
    model.W_out.data[...] = 0.0
    model.b_out.data[...] = np.array([0.0, 1.0], np.float32)  # always "positive"
    result = model.evaluate([model.prepare(binary.train)])
    assert result["binary"] == 0.5  # one positive root of two
    labelled = np.concatenate([t.labels for t in binary.train])
    assert result["phrase"] == pytest.approx(np.mean(labelled[labelled >= 0] == 1))
    assert "fine" not in result


def test_best_epoch_is_the_first_highest_dev_score():
    history = [(None, {"fine": 0.4}), (None, {"fine": 0.5}), (None, {"fine": 0.5}),
               (None, {"fine": float("nan")})]
    assert best_epoch(history, "fine") == 2
    assert best_epoch(history, "binary") is None


class _Scripted(Module):
    """One weight that every step lowers by exactly 1 (loss w, SGD lr 1, one target a step),
    and dev scores read from a script: after epoch k the weight is -k."""

    class Batch:
        num_targets = num_samples = 1

    def __init__(self, scores):
        self.w = Parameter(np.zeros(1))
        self.scores = iter(scores)

    def prepare(self, samples):
        return self.Batch()

    def loss(self, batch):
        return mc.sum(self.w)

    def evaluate(self, batches):
        return {"loss": 0.0, "fine": next(self.scores)}


def test_fit_keeps_the_weights_of_the_best_dev_epoch():
    model = _Scripted([0.2, 0.5, 0.4])
    history = fit(model, SGD(model.parameters(), lr=1.0), [0], [0], epochs=3, batch_size=1,
                  progress=False, keep_best="fine", log=lambda line: None)
    assert len(history) == 3 and model.w.data.tolist() == [-2.0]
    model = _Scripted([0.2, 0.5, 0.4])  # without keep_best: the last epoch's weights
    fit(model, SGD(model.parameters(), lr=1.0), [0], [0], epochs=3, batch_size=1,
        progress=False, log=lambda line: None)
    assert model.w.data.tolist() == [-3.0]


class _TwoMetrics(_Scripted):
    """Dev scores that peak on fine at epoch 1 and on binary at epoch 2; the test figures
    read the weight, so they say which epoch's weights were kept."""

    def __init__(self, num_classes):
        super().__init__([{"loss": 0.0, "fine": fine, "binary": binary, "phrase": 0.5}
                          for fine, binary in ((0.5, 0.6), (0.4, 0.9), (0.3, 0.7))])
        self.weights = []  # after each epoch

    def evaluate(self, batches):
        scores = next(self.scores, None)
        if scores is not None:
            self.weights.append(float(self.w.data[0]))
            return scores
        kept = self.weights.index(float(self.w.data[0])) + 1  # the epoch of the kept weights
        return {"loss": 0.0, "fine": kept / 10, "binary": kept / 10, "phrase": kept / 10}


def _experiment_args(*options):
    parser = argparse.ArgumentParser()
    add_sst_arguments(parser)
    args = parser.parse_args(["--optimizer", "adagrad", *options])
    for name, value in dict(seed=0, epochs=3, batch_size=1, lr=1.0, clip=0, progress=False,
                            data=None, train_trees=None).items():
        setattr(args, name, value)
    return args


@pytest.mark.parametrize("keep_best, epoch", [(None, 1), ("fine", 1), ("binary", 2)])
def test_keep_best_picks_the_epoch_by_the_chosen_dev_metric(keep_best, epoch):
    """--keep-best binary selects a 5-class model's epoch by its dev polarity (the binary
    task through the 5-class model) and reports that figure; the default is the task's."""
    args = _experiment_args(*(["--keep-best", keep_best] if keep_best else []))
    lines = []
    result = sentiment_experiment("scripted", args, _splits(), _TwoMetrics, log=lines.append)
    (run,) = result["runs"]
    assert run["best_epoch"] == epoch and run["test"]["fine"] == pytest.approx(epoch / 10)
    reported = keep_best or "fine"
    assert result["metric"] == reported
    assert f"test root accuracy {reported} {10 * epoch:.1f} ± 0.0 %" in lines[-1]


def test_keep_best_fine_is_refused_for_a_binary_task():
    args = _experiment_args("--task", "binary", "--keep-best", "fine")
    with pytest.raises(ArgumentError, match="--keep-best fine: a --task binary model reports "
                                            "binary, phrase"):
        sentiment_experiment("scripted", args, _splits(), _TwoMetrics, log=lambda line: None)


def test_dropout_acts_in_training_mode_only():
    splits = _splits()
    model = TreeLSTMClassifier(len(splits.vocab), embed_dim=6, hidden=5, dropout=0.5,
                               embed_dropout=0.5)
    batch = model.prepare(splits.train)
    every = np.arange(batch.graphs.num_vertices)
    model.eval()
    first, second = model.logits_at(batch, every).numpy(), model.logits_at(batch, every).numpy()
    assert np.array_equal(first, second)  # no mask drawn
    model.train()
    dropped = model.logits_at(batch, every).numpy()
    assert not np.allclose(dropped, first)
    pulled = model.pull(batch).numpy()
    leaves = batch.graphs.num_children == 0
    assert np.any(pulled[leaves] == 0) and np.any(pulled[leaves] != 0)
    model.evaluate([batch])  # evaluates in eval mode and gives training mode back
    assert model.training and np.any(model.pull(batch).numpy()[leaves] == 0)


def test_a_model_pulling_dropped_vectors_equals_its_per_sample_run():
    splits = _splits()
    model = TreeLSTMClassifier(len(splits.vocab), embed_dim=4, hidden=3, dtype="float64",
                               embed_dropout=0.3, leaf_loss=True).eval()
    batch = model.prepare(splits.train)
    losses = []
    for run in (None, evaluate_per_sample):
        model.zero_grad()
        loss = model.loss(batch, run=run)
        loss.backward()
        losses.append((loss.item(), model.embedding.weight.grad.numpy().copy()))
    assert losses[0][0] == pytest.approx(losses[1][0], rel=1e-12)
    assert np.allclose(losses[0][1], losses[1][1], rtol=1e-10, atol=1e-12)
    assert np.any(losses[0][1] != 0)


def test_adagrad_step_with_l2_by_hand():
    p = Parameter(np.array([1.0, -2.0]))
    optimizer = Adagrad([p], lr=0.1, eps=1e-10, weight_decay=0.5)
    sums = np.zeros(2)
    expected = np.array([1.0, -2.0])
    for grad in ([0.5, 1.0], [-1.0, 2.0]):
        p.grad = mc.tensor(np.array(grad))
        optimizer.step()
        g = np.array(grad) + 0.5 * expected  # the L2 penalty's gradient
        sums += g * g
        expected = expected - 0.1 * g / (np.sqrt(sums) + 1e-10)
    # first step: g = (1, 0), s = (1, 0): p = (1 - 0.1, -2 - 0) — the zero gradient moves nothing
    assert np.allclose(expected, p.data) and p.data[1] != -2.0


def test_make_optimizer_gives_the_embeddings_their_own_rate_and_penalty():
    model = TreeRNNClassifier(10, hidden=3)
    args = argparse.Namespace(optimizer="adagrad", lr=0.05, embed_lr=0.1, l2=1e-4, embed_l2=0.0)
    optimizer = make_optimizer(args, model)
    others, embedding = optimizer.param_groups
    assert [id(p) for p in embedding["params"]] == [id(model.embedding.weight)]
    assert (embedding["lr"], embedding["weight_decay"]) == (0.1, 0.0)
    assert (others["lr"], others["weight_decay"]) == (0.05, 1e-4)
    assert len(others["params"]) == 4  # W, b, W_out, b_out


def test_clip_grad_norm_scales_to_the_limit_by_hand():
    a, b = Parameter(np.zeros(2)), Parameter(np.zeros(1))
    a.grad, b.grad = mc.tensor(np.array([3.0, 0.0])), mc.tensor(np.array([4.0]))
    assert clip_grad_norm([a, b], 1.0).item() == pytest.approx(5.0)
    assert np.allclose(a.grad.numpy(), [0.6, 0.0]) and np.allclose(b.grad.numpy(), [0.8])
    assert clip_grad_norm([a, b], 2.0).item() == pytest.approx(1.0)  # under: unchanged
    assert np.allclose(a.grad.numpy(), [0.6, 0.0])


def test_mean_and_std_over_seeds():
    assert mean_and_std([0.4, 0.5, 0.6]) == (pytest.approx(0.5), pytest.approx(0.1))
    assert mean_and_std([0.4]) == (0.4, 0.0)


def test_glove_vectors_fill_the_matched_rows_and_keep_the_others(tmp_path):
    vocab = Vocabulary(["the", "film", "good"])
    path = tmp_path / "glove.txt"
    path.write_text("film 1 2 3\nunseen 9 9 9\nthe -1 0.5 2e-1\nfilm 7 7 7\n")
    table = np.full((4, 3), 5.0, np.float32)
    assert load_word_vectors(path, vocab, table) == 2
    assert table[vocab.lookup("film")].tolist() == [1, 2, 3]  # the first vector wins
    assert np.allclose(table[vocab.lookup("the")], [-1, 0.5, 0.2])
    assert table[vocab.lookup("good")].tolist() == [5, 5, 5]
    assert table[0].tolist() == [5, 5, 5]  # <unk>
    header = tmp_path / "word2vec.txt"
    header.write_text("2 3\ngood 0 0 1\n")
    assert load_word_vectors(header, vocab, table) == 1


def test_glove_vectors_of_another_dimension_or_no_file_are_clear_errors(tmp_path):
    vocab = Vocabulary(["film"])
    path = tmp_path / "glove.txt"
    path.write_text("film 1 2 3 4\n")
    table = np.zeros((2, 3))
    with pytest.raises(DataError, match=r"glove.txt:1: the vector of 'film' has 4 values; "
                                        r"the embedding has dimension 3.*--embed-dim 4"):
        load_word_vectors(path, vocab, table)
    assert not table.any()
    path.write_text("film 1 x 3\n")
    with pytest.raises(DataError, match="glove.txt:1: .* not a number"):
        load_word_vectors(path, vocab, table)
    with pytest.raises(DataError, match="absent.txt: cannot read it"):
        load_word_vectors(tmp_path / "absent.txt", vocab, table)


def test_language_model_perplexity_counts_eos_per_word():
    """With W_out = 0 every position predicts softmax(b_out): perplexity by hand."""
    model = VarLSTMLanguageModel(4, embed_dim=3, hidden=2, dtype="float64", bos_id=1)
    model.W_out.data[...] = 0.0
    model.b_out.data[...] = [0.0, 1.0, 2.0, 0.5]
    sentences = [np.array([2, 3, 1]), np.array([3, 1])]  # id 1 is <eos>, a target too
    probabilities = np.exp([0.0, 1.0, 2.0, 0.5]) / np.exp([0.0, 1.0, 2.0, 0.5]).sum()
    targets = [2, 3, 1, 3, 1]
    expected = math.exp(-np.mean(np.log(probabilities[targets])))
    result = model.evaluate([model.prepare(sentences)])
    assert result["perplexity"] == pytest.approx(expected, rel=1e-12)


def _lm_loss_and_embedding_grad(model, batch, run=None):
    model.zero_grad()
    loss = model.loss(batch, run=run)
    loss.backward()
    return loss.item(), model.embedding.weight.grad.numpy().copy()


def test_language_model_dropout_drops_in_training_only():
    """With dropout F pulls word vectors looked up outside it: in eval mode the model is the
    dropout-free one with the same weights, in training the masks change the loss, and the
    batched run equals the per-sample run under the same masks."""
    sentences = [np.array([2, 3, 1]), np.array([1]), np.array([3, 2, 2, 1])]
    plain = VarLSTMLanguageModel(4, embed_dim=3, hidden=2, dtype="float64")
    dropped = VarLSTMLanguageModel(4, embed_dim=3, hidden=2, dtype="float64", dropout=0.5)
    dropped.load_state_dict(plain.state_dict())
    batch = plain.prepare(sentences)
    dropped.eval()
    expected = _lm_loss_and_embedding_grad(plain, batch)
    loss, grad = _lm_loss_and_embedding_grad(dropped, batch)
    assert loss == pytest.approx(expected[0], rel=1e-12)
    assert np.allclose(grad, expected[1], rtol=1e-10, atol=1e-14)
    assert dropped.evaluate([batch]) == pytest.approx(plain.evaluate([batch]), rel=1e-12)
    assert not dropped.training  # evaluate() restores the mode it found
    dropped.train()
    results = []
    for run in (None, evaluate_per_sample):
        mc.seed(7)  # the same masks for both runs
        results.append(_lm_loss_and_embedding_grad(dropped, batch, run))
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-12)
    assert np.allclose(results[0][1], results[1][1], rtol=1e-10, atol=1e-14)
    assert results[0][0] != pytest.approx(expected[0], rel=1e-6)
    with pytest.raises(ValueError, match="dropout must be in"):
        VarLSTMLanguageModel(4, dropout=1.0)


def test_fixed_language_model_takes_its_dropout_masks_as_graph_inputs():
    """The traced graph with mask inputs equals the eager network under the same masks, in
    value and gradient; in eval mode it is the dropout-free model with the same weights."""
    rows = stream_rows([np.arange(1, 9), np.array([3, 3, 1]), np.arange(8, 0, -1)], steps=4)
    plain = FixedLSTMLanguageModel(9, embed_dim=3, hidden=2, steps=4, dtype="float64")
    dropped = FixedLSTMLanguageModel(9, embed_dim=3, hidden=2, steps=4, dtype="float64",
                                     dropout=0.4)
    dropped.load_state_dict(plain.state_dict())
    batch = plain.prepare(rows)
    assert dropped.evaluate([batch]) == pytest.approx(plain.evaluate([batch]), rel=1e-12)
    mc.seed(3)
    masks = dropped.dropout_masks(batch)
    assert [m.shape for m in masks] == [(batch.num_targets, 3), (batch.num_targets, 2)]
    values = np.concatenate([m.numpy().ravel() for m in masks])
    assert set(np.round(values, 12)) <= {0.0, round(1 / 0.6, 12)} and 0 in values
    results = []
    for static in (True, False):
        dropped.zero_grad()
        loss = dropped.loss(batch, static=static, masks=masks)
        loss.backward()
        results.append((loss.item(), [p.grad.numpy().copy() for p in dropped.parameters()]))
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-12)
    for static_grad, eager_grad in zip(results[0][1], results[1][1]):
        assert np.allclose(static_grad, eager_grad, rtol=1e-10, atol=1e-14)
    plain_loss = plain.loss(batch).item()
    assert results[0][0] != pytest.approx(plain_loss, rel=1e-6)
    mc.seed(3)  # in training, loss() draws the same masks from the same seed
    assert dropped.loss(batch).item() == pytest.approx(results[0][0], rel=1e-12)
    with pytest.raises(ValueError, match="dropout must be in"):
        FixedLSTMLanguageModel(4, dropout=-0.1)


def test_the_kneser_ney_reference_of_the_language_model_table():
    """docs/results/lm/ngram_baseline.py's bigram: a probability worked by hand, and every
    context's distribution sums to one over the vocabulary, unseen words and contexts too."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "docs/results/lm/ngram_baseline.py"
    module_spec = importlib.util.spec_from_file_location("ngram_baseline", path)
    baseline = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(baseline)
    train = [["a", "b", "<eos>"], ["a", "<eos>"]]
    vocab = {"a", "b", "c", "<eos>"}  # "c" only in held-out text
    probability, discount = baseline.kneser_ney_bigram(train, vocab)
    # bigrams <eos>a x2, ab, b<eos>, a<eos>: n1 = 3, n2 = 1, D = 3 / (3 + 2)
    assert discount == pytest.approx(0.6)
    # continuation(a) = (1 - D) / 4 + (D * 3 / 4) / 4; P(a | <eos>) = (2 - D) / 2 + D / 2 * it
    assert probability("<eos>", "a") == pytest.approx(0.7 + 0.3 * 0.2125)
    for context in ("a", "b", "<eos>", "c"):
        assert sum(probability(context, w) for w in vocab) == pytest.approx(1.0)


@pytest.mark.parametrize("fixed", [False, True], ids=["var", "fixed"])
def test_tied_language_models_use_the_embedding_as_softmax_weights(fixed):
    """With tie_weights there is no W_out: the logits are h @ embedding.T, the embedding's
    gradient gathers both uses, and batched (static) equals per-sample (eager)."""
    if fixed:
        model = FixedLSTMLanguageModel(9, embed_dim=3, hidden=3, steps=4, dtype="float64",
                                       tie_weights=True)
        batch = model.prepare(stream_rows([np.arange(1, 9), np.arange(8, 0, -1)], steps=4))
        runs = [lambda: model.loss(batch), lambda: model.loss(batch, static=False)]
    else:
        model = VarLSTMLanguageModel(9, embed_dim=3, hidden=3, dtype="float64",
                                     tie_weights=True)
        batch = model.prepare([np.array([2, 3, 1]), np.array([4, 4, 5, 1])])
        runs = [lambda: model.loss(batch), lambda: model.loss(batch, run=evaluate_per_sample)]
    assert "W_out" not in dict(model.named_parameters())
    results = []
    for run in runs:
        model.zero_grad()
        loss = run()
        loss.backward()
        results.append((loss.item(), model.embedding.weight.grad.numpy().copy()))
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-12)
    assert np.allclose(results[0][1], results[1][1], rtol=1e-10, atol=1e-14)
    # Every row gets a gradient through the softmax, even words never read as input.
    assert np.all(np.abs(results[0][1]).sum(axis=1) > 0)
    untied = type(model)(9, embed_dim=3, hidden=3, dtype="float64",
                         **({"steps": 4} if fixed else {}))
    state = dict(model.state_dict(), W_out=model.embedding.weight.numpy().T.copy())
    untied.load_state_dict(state)
    assert untied.loss(batch).item() == pytest.approx(results[0][0], rel=1e-12)
    with pytest.raises(ValueError, match="tie_weights needs embed_dim == hidden"):
        type(model)(9, embed_dim=3, hidden=4, tie_weights=True)
