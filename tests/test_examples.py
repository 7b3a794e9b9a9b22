"""Every example runs end to end on tiny inputs, and so does the main job
(``python -m minicavs train tree-lstm``), with its checkpoint and ``--resume``."""

import importlib.util
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import minicavs as mc
from minicavs.data import synthetic_vocabulary
from minicavs.models import TreeLSTMClassifier
from minicavs.training import get_blas_threads, set_blas_threads

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
QUICK = ["--epochs", "1", "--no-progress"]
HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None

SST_LINES = [
    "(3 (2 (2 The) (2 film)) (4 (2 is) (4 (3 very) (4 good))))",
    "(1 (2 (2 The) (2 plot)) (1 (2 is) (0 (1 dull) (2 .))))",
    "(2 (2 It) (2 (2 was) (2 long)))",
]


def _example(name):
    """Import examples/<name>.py as a module (examples are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def _restore_blas_threads():
    """The examples set the BLAS thread count (--threads); other tests get theirs back."""
    before = get_blas_threads()
    yield
    if before is not None:
        set_blas_threads(before)


@pytest.fixture
def sst_dir(tmp_path):
    for name in ("train", "dev", "test"):
        (tmp_path / f"{name}.txt").write_text("\n".join(SST_LINES) + "\n")
    return tmp_path


def test_tree_lstm_example(capsys):
    result = _example("tree_lstm").main(QUICK + ["--train-size", "64", "--hidden", "8",
                                                 "--embed-dim", "8"])
    (run,) = result["runs"]
    assert 0.0 <= run["test"]["fine"] <= 1.0 and run["trees_per_second"] > 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("tree_lstm: fine task, test root accuracy fine") and "1 seed" in last


def test_tree_lstm_example_reads_sst(sst_dir, capsys):
    result = _example("tree_lstm").main(QUICK + ["--data", str(sst_dir), "--hidden", "4"])
    assert set(result["test"]) == {"loss", "fine", "binary", "phrase"}


def test_tree_lstm_example_binary_task_with_the_papers_settings(sst_dir, tmp_path, capsys):
    """--task binary drops the neutral sentence and trains a 2-class model; two seeds give a
    mean and std; --word-vectors reports its matches; --plot writes a PNG (or says why not)."""
    vectors = tmp_path / "vectors.txt"
    vectors.write_text("film 0.1 0.2 0.3 0.4\ngood 0.5 0.6 0.7 0.8\nabsent 1 1 1 1\n")
    plot = tmp_path / "curves.png"
    result = _example("tree_lstm").main(
        ["--epochs", "2", "--no-progress", "--data", str(sst_dir), "--hidden", "4",
         "--embed-dim", "4", "--task", "binary", "--optimizer", "adagrad", "--lr", "0.05",
         "--embed-lr", "0.1", "--l2", "1e-4", "--dropout", "0.5", "--embed-dropout", "0.2",
         "--clip", "5", "--seeds", "2", "--word-vectors", str(vectors), "--leaf-loss"]
        + (["--plot", str(plot)] if HAVE_MATPLOTLIB else []))
    out = capsys.readouterr().out
    assert "2 / 2 / 2 train / dev / test trees" in out  # the neutral third sentence dropped
    assert out.count("word vectors: 2 of") == 2
    assert [run["seed"] for run in result["runs"]] == [0, 1]
    assert set(result["test"]) == {"loss", "binary", "phrase"}
    accuracies = [run["test"]["binary"] for run in result["runs"]]
    assert result["test"]["binary"][0] == pytest.approx(np.mean(accuracies))
    assert result["test"]["binary"][1] == pytest.approx(np.std(accuracies, ddof=1))
    assert "binary task, test root accuracy binary" in out and "over 2 seed(s)" in out
    if HAVE_MATPLOTLIB:  # (without it --plot is refused up front: tests/test_bad_input.py)
        assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("model", ["treernn", "rntn", "treelstm"])
def test_recursive_trees_example(model, sst_dir, capsys):
    result = _example("recursive_trees").main(
        QUICK + ["--model", model, "--data", str(sst_dir), "--hidden", "4", "--embed-dim", "4",
                 "--train-trees", "2"])
    assert 0.0 <= result["runs"][0]["test"]["fine"] <= 1.0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith(f"{model}: fine task")


def test_recursive_trees_example_with_socher_et_al_s_settings(sst_dir, monkeypatch, capsys):
    """--init corenlp, rare words to <unk>, word dropout, the loss per sentence, AdaGrad's eps
    and its reset every epoch, plain SGD on the embeddings: all reach the run."""
    from minicavs import training

    resets, made = [], []
    original = training.make_optimizer

    def spying(args, model):
        optimizer = original(args, model)
        made.append(optimizer)
        monkeypatch.setattr(optimizer, "reset_state", lambda: resets.append(True))
        return optimizer

    monkeypatch.setattr(training, "make_optimizer", spying)
    result = _example("recursive_trees").main(
        ["--epochs", "3", "--no-progress", "--model", "rntn", "--data", str(sst_dir),
         "--hidden", "4", "--init", "corenlp", "--min-count", "2", "--word-dropout", "0.2",
         "--optimizer", "adagrad", "--lr", "0.01", "--adagrad-eps", "1e-3", "--adagrad-reset",
         "--loss-per", "sentence", "--embed-optimizer", "sgd", "--embed-lr", "0.1",
         "--leaf-tanh", "--classifier-l2", "1e-4", "--l2", "1e-3", "--embed-l2", "1e-4",
         "--embed-l2-rows", "batch"])
    assert "vocabulary 3" in capsys.readouterr().out  # <unk>, The, is
    assert len(resets) == 3 and len(made[0].optimizers) == 2
    assert made[0].optimizers[0].eps == 1e-3
    assert made[0].optimizers[0].param_groups[1]["weight_decay"] == 1e-4  # W_out
    assert 0.0 <= result["runs"][0]["test"]["fine"] <= 1.0


def test_child_sum_example_on_sst_and_nary_trees(sst_dir):
    module = _example("child_sum_tree_lstm")
    module.main(QUICK + ["--data", str(sst_dir), "--hidden", "4"])
    result = module.main(QUICK + ["--nary", "--train-size", "64", "--hidden", "8"])
    assert 0.0 <= result["test"]["fine"] <= 1.0


def test_tree_fc_example(capsys):
    result = _example("tree_fc").main(QUICK + ["--train-size", "20", "--leaves", "16",
                                               "--hidden", "8"])
    assert 0.0 <= result["held_out"]["fine"] <= 1.0
    assert "vertices/s" in capsys.readouterr().out.strip().splitlines()[-1]


@pytest.mark.parametrize("name", ["var_lstm_lm", "fixed_lstm_lm"])
def test_language_model_examples(name, tmp_path, capsys):
    module = _example(name)
    result = module.main(QUICK + ["--sentences", "200", "--hidden", "8", "--embed-dim", "8"]
                         + (["--steps", "8"] if name == "fixed_lstm_lm" else []))
    assert np.isfinite(result["held_out"]["perplexity"])
    assert "perplexity" in capsys.readouterr().out.strip().splitlines()[-1]
    # --data takes one text file too (its last tenth held out).
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(["the cat sat on the mat", "a dog ran", "the dog sat"] * 10))
    module.main(QUICK + ["--data", str(corpus), "--hidden", "4"]
                + (["--steps", "4"] if name == "fixed_lstm_lm" else []))
    # --dropout trains through the masked graph and evaluates without masks; --plot draws
    # the perplexity curve (or says why not).
    plot = tmp_path / "curves.png"
    capsys.readouterr()
    result = module.main(QUICK + ["--data", str(corpus), "--hidden", "4", "--dropout", "0.5"]
                         + (["--plot", str(plot)] if HAVE_MATPLOTLIB else [])
                         + (["--steps", "4"] if name == "fixed_lstm_lm" else []))
    assert np.isfinite(result["held_out"]["perplexity"])
    if HAVE_MATPLOTLIB:  # (without it --plot is refused up front: tests/test_bad_input.py)
        assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("name", ["var_lstm_lm", "fixed_lstm_lm"])
def test_language_model_examples_tie_weights_of_one_size_only(name, capsys):
    result = _example(name).main(QUICK + ["--sentences", "100", "--hidden", "6",
                                          "--embed-dim", "6", "--tie-weights"]
                                 + (["--steps", "8"] if name == "fixed_lstm_lm" else []))
    assert np.isfinite(result["held_out"]["perplexity"])
    with pytest.raises(SystemExit):
        _example(name).main(["--tie-weights", "--embed-dim", "4", "--hidden", "8"])
    assert "--tie-weights needs --embed-dim equal to --hidden" in capsys.readouterr().err


def test_language_model_example_reads_a_ptb_directory(tmp_path):
    # Like this repository's copy of PTB: no training file, so it trains on valid.
    for name in ("valid", "test"):
        (tmp_path / f"ptb.{name}.txt").write_text(" the cat sat on the mat \n a dog ran \n" * 5)
    result = _example("var_lstm_lm").main(QUICK + ["--data", str(tmp_path), "--hidden", "4"])
    assert np.isfinite(result["held_out"]["loss"])


def test_seq2seq_example(capsys):
    result = _example("seq2seq").main(QUICK + ["--train-size", "64", "--hidden", "8",
                                               "--max-length", "3", "--beam-size", "3"])
    assert 0.0 <= result["held_out"]["sequence_accuracy"] <= 1.0
    assert 0.0 <= result["held_out"]["beam_sequence_accuracy"] <= 1.0
    assert "greedy exact match" in capsys.readouterr().out.strip().splitlines()[-1]


def test_td_tree_lstm_example(capsys):
    result = _example("td_tree_lstm").main(QUICK + ["--train-size", "48", "--hidden", "8",
                                                    "--embed-dim", "4", "--generate", "10",
                                                    "--max-vertices", "15"])
    assert result["generated"] == 10 and np.isfinite(result["test"]["loss"])
    assert 1 <= result["mean_vertices"] <= 15
    assert "trees/s" in capsys.readouterr().out.strip().splitlines()[-1]


def test_lrcn_example_learns(capsys):
    # past the first plateau (the CNN learning to read): the loss falls well below ln 10
    # and the sequence accuracy is three times chance (0.1), in about seven seconds
    result = _example("lrcn").main(["--epochs", "6", "--sequences", "2000", "--max-length", "3",
                                    "--batch-size", "16", "--no-progress"])
    assert result["losses"][0] > 2.2 and result["losses"][-1] < 1.6
    assert result["accuracy"] > 0.2 and result["frames_per_second"] > 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("lrcn: held-out accuracy") and "frames/s" in last


def test_examples_explain_their_options():
    for path in sorted(EXAMPLES.glob("*.py")):
        module = _example(path.stem)
        with pytest.raises(SystemExit) as stop:
            module.parse_args(["--help"])
        assert stop.value.code == 0, path.name


# --- the main job ------------------------------------------------------------------------------

def _minicavs(*args, cwd):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "minicavs", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_main_job_help_explains_every_option(tmp_path):
    done = _minicavs("train", "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    for option in ["--data", "--epochs", "--batch-size", "--save", "--resume", "--device",
                   "--sizes", "--hidden", "--embed-dim", "--lr", "--seed", "--threads",
                   "tree-lstm"]:
        assert option in done.stdout, option
    assert "root accuracy" in done.stdout


def test_main_job_trains_saves_and_resumes(tmp_path):
    tiny = ["--sizes", "96,32,32", "--hidden", "8", "--embed-dim", "8", "--no-progress"]
    done = _minicavs("train", "tree-lstm", "--epochs", "1", *tiny, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = done.stdout.strip().splitlines()[-1]
    assert summary.startswith("tree-lstm: test root accuracy fine"), summary
    checkpoint = tmp_path / "runs" / "tree-lstm.npz"  # the default --save
    assert checkpoint.is_file()
    assert not [p for p in checkpoint.parent.iterdir() if p.name.endswith(".tmp")]

    # The checkpoint holds a model the library can load.
    model = TreeLSTMClassifier(len(synthetic_vocabulary()), 8, 8)
    saved = mc.nn.load_checkpoint(checkpoint, model)
    assert saved["extra"]["epoch"] == 1 and saved["hyperparameters"]["hidden"] == 8

    done = _minicavs("train", "tree-lstm", "--epochs", "2", "--resume", str(checkpoint),
                     *tiny, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "resumed from" in done.stdout and "epoch 2/2" in done.stdout
    assert "epoch 1/2" not in done.stdout


def test_main_job_reports_bad_input_clearly(tmp_path):
    done = _minicavs("train", "tree-lstm", "--data", str(tmp_path / "missing"), cwd=tmp_path)
    assert done.returncode == 1 and "missing: does not exist" in done.stdout
    done = _minicavs("train", "tree-lstm", "--resume", str(tmp_path / "none.npz"), "--sizes",
                     "8,8,8", cwd=tmp_path)
    assert done.returncode == 1 and "no checkpoint at" in done.stdout
