"""Bad input at every public entry point gets a minicavs error that names the argument, the
sample, vertex or file:line, and what was expected — the cases of the bad-input catalogue
(docs/bad_input.md lists them with their outcome)."""

import argparse
import importlib.util
import os

import numpy as np
import pytest

import minicavs as mc
from minicavs import data, training, validate
from minicavs.__main__ import build_parser, main

# --- tensors -----------------------------------------------------------------------------------


@pytest.mark.parametrize("value, error, message", [
    (None, mc.DTypeError, "a tensor needs numbers, got None"),
    (np.array(["a"]), mc.DTypeError, r"got dtype <U1 \(strings\)"),
    (["a", "b"], mc.DTypeError, r"got dtype <U1 \(strings\)"),
    (np.array([object()]), mc.DTypeError, r"got dtype object \(Python objects"),
    (np.array([1j]), mc.DTypeError, r"complex numbers are not supported"),
    ([[1.0], [1.0, 2.0]], mc.ShapeError, r"nested lists must be rectangular"),
])
def test_tensors_hold_numbers(value, error, message):
    with pytest.raises(error, match=message):
        mc.tensor(value)


def test_tensor_conversions_are_checked():
    with pytest.raises(mc.DTypeError, match=r"cannot convert nan to int64"):
        mc.tensor([1.0, np.nan], dtype="int64")
    with pytest.raises(mc.DTypeError, match=r"cannot convert 1e\+30 to int32"):
        mc.tensor(np.array([1e30]), dtype="int32")
    with pytest.raises(mc.ArgumentError, match=r"mc.tensor: dtype must be a bool, integer or "
                                               r"float dtype, got 'float128x'"):
        mc.tensor([1.0], dtype="float128x")
    with pytest.raises(mc.DTypeError, match="got dtype <U1"):
        mc.Tensor(np.array(["x"]))
    assert mc.tensor([1, 2], dtype="int64").dtype == np.int64  # what is valid still works


# --- input graphs and batches ------------------------------------------------------------------

@pytest.mark.parametrize("children, message", [
    ([[], None], r"sample 3: vertex 1: its children must be a list of vertex indices \(\[\] for "
                 r"a leaf\), got NoneType None"),
    (5, r"sample 3: children must be a list with one list of child indices per vertex, got "
        r"int 5"),
    ("ab", r"children must be a list .* got str 'ab'"),
    ([[], [2**70]], r"sample 3: vertex 1: child index 1180591620717411303424 is out of range "
                    r"for a graph of 2 vertices \(valid: 0..1\)"),
    ([[], [True]], r"vertex 1: child True is not an integer vertex index"),
    ([[], [np.float64(0)]], r"vertex 1: child np.float64\(0.0\) is not an integer"),
    ([[], [[0]]], r"vertex 1: child \[0\] is not an integer vertex index"),
    (None, r"children must be a list .* got NoneType"),
])
def test_malformed_children_name_the_sample_and_vertex(children, message):
    with pytest.raises(mc.GraphError, match=message):
        mc.InputGraph(children, sample=3)


def test_graph_constructors_and_batches_check_their_arguments():
    with pytest.raises(mc.GraphError, match=r"n must be an integer >= 1, got 2.5"):
        mc.InputGraph.chain(2.5)
    with pytest.raises(mc.GraphError, match="power-of-two number of leaves, got 3"):
        mc.InputGraph.complete_binary(3)
    with pytest.raises(mc.GraphError, match="parents must be integers, got dtype float64"):
        mc.InputGraph.from_parents([-1.0, 0.0])
    with pytest.raises(mc.GraphError, match="made from a list of InputGraphs, got InputGraph"):
        mc.GraphBatch(mc.InputGraph.chain(2))
    with pytest.raises(mc.GraphError, match="made from a list of InputGraphs, got int"):
        mc.GraphBatch(5)
    with pytest.raises(mc.GraphError, match="sample 1: expected an InputGraph, got list"):
        mc.GraphBatch([mc.InputGraph.chain(2), [[], [0]]])
    # numpy arrays and ranges are fine as child lists
    g = mc.InputGraph([np.array([], np.int64), range(0, 1), (0, 1)])
    assert g.children(2) == [0, 1]


# --- vertex functions --------------------------------------------------------------------------

def _identity(v):
    v.scatter(v.gather(0))


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(scatter_shape=(0,)), mc.ShapeError, r"VertexFunction: scatter_shape must be a shape: a "
                                              r"tuple of integer sizes >= 1, got \(0,\)"),
    (dict(scatter_shape=(-1,)), mc.ShapeError, r"scatter_shape must be a shape.*got \(-1,\)"),
    (dict(scatter_shape="4"), mc.ShapeError, r"scatter_shape must be a shape: a tuple of sizes "
                                             r"such as \(64,\), got '4'"),
    (dict(scatter_shape=(2,), pull_shape=(2.0,)), mc.ShapeError, r"pull_shape must be a shape"),
    (dict(scatter_shape=(2,), arity=-1), mc.GraphError, r"VertexFunction: arity \(the most "
                                                        r"children a vertex may have\) must be "
                                                        r">= 0, got -1"),
    (dict(scatter_shape=(2,), arity=1.5), mc.GraphError, r"arity .* must be an integer, got 1.5"),
    (dict(scatter_shape=(2,), arity=1, dtype="int64"), mc.DTypeError,
     r"VertexFunction: dtype \(of the states\) must be a float dtype, got 'int64'"),
    (dict(scatter_shape=(2,), arity=1, pull_dtype="str"), mc.DTypeError,
     r"pull_dtype must be a bool, integer or float dtype, got 'str'"),
    (dict(scatter_shape=(2,), arity=1, options={"bogus": 1}), mc.GraphError,
     r"options: unknown switch 'bogus'; the switches are regroup_sums"),
    (dict(scatter_shape=(2,), arity=1, name=7), mc.GraphError, r"name must be a string, got 7"),
])
def test_vertex_function_arguments_are_checked_when_it_is_made(kwargs, error, message):
    with pytest.raises(error, match=message):
        mc.VertexFunction(_identity, **kwargs)


def test_an_integer_shape_means_a_vector_as_in_numpy():
    F = mc.VertexFunction(_identity, scatter_shape=5, arity=1)
    assert F.scatter_shape == (5,)
    out = F(mc.GraphBatch([mc.InputGraph.chain(3)]))
    assert out.shape == (3, 5) and not out.numpy().any()


def test_cell_must_be_a_function():
    with pytest.raises(mc.GraphError, match="cell must be a function cell\\(v\\) that defines "
                                            "one vertex, got NoneType"):
        mc.VertexFunction(None, scatter_shape=(2,))


@pytest.mark.parametrize("convert, what", [(float, "float()"), (int, "int()"),
                                           (complex, "complex()"),
                                           (lambda x: [0, 1, 2][x], "use as an index")])
def test_a_symbol_is_not_a_number_while_tracing(convert, what):
    def cell(v):
        h = v.gather(0)
        convert(h)  # line of the user's mistake
        v.scatter(h)
    with pytest.raises(mc.GraphError) as info:
        mc.VertexFunction(cell, scatter_shape=(2,), arity=1)
    message = str(info.value)
    assert message.startswith(f"{what} of traced value 'input gather0' of shape (V, 2)")
    assert "\n  at " + __file__ in message  # the user's line (the lambda's, for indexing)


def test_wrong_call_arguments_of_a_vertex_function():
    F = mc.VertexFunction(lambda v: v.scatter(v.gather(0) + v.pull()), scatter_shape=(2,),
                          pull_shape=(2,), arity=1, name="F")
    batch = mc.GraphBatch([mc.InputGraph.chain(3)])
    with pytest.raises(mc.GraphError, match="is called on a GraphBatch, got list"):
        F([mc.InputGraph.chain(3)], pull=np.zeros((3, 2), np.float32))
    with pytest.raises(mc.GraphError, match="pull= is required"):
        F(batch)
    with pytest.raises(mc.ShapeError, match=r"pull has shape \(2, 2\), expected \(3, 2\)"):
        F(batch, pull=np.zeros((2, 2), np.float32))
    with pytest.raises(mc.DTypeError, match="pull has dtype float64, expected float32"):
        F(batch, pull=np.zeros((3, 2)))
    with pytest.raises(mc.DTypeError, match="a tensor holds bool, integer or float values"):
        F(batch, pull=np.full((3, 2), "a"))


# --- optimisers --------------------------------------------------------------------------------

def _param():
    return mc.Parameter(np.ones(3, np.float32))


@pytest.mark.parametrize("make, message", [
    (lambda: mc.nn.SGD([_param()], lr=float("nan")), r"SGD: lr must be a finite number, got nan"),
    (lambda: mc.nn.SGD([_param()], lr=-0.1), r"SGD: lr must be >= 0, got -0.1"),
    (lambda: mc.nn.SGD([_param()], lr=0.1, momentum=-1), r"SGD: momentum must be >= 0, got -1"),
    (lambda: mc.nn.Adam([_param()], lr="0.1"), r"Adam: lr must be a real number, got '0.1'"),
    (lambda: mc.nn.Adam([_param()], betas=(0.9, 1.0)), r"betas\[1\] must be in \[0, 1\), got 1"),
    (lambda: mc.nn.Adam([_param()], betas=0.9), r"betas must be a pair \(beta1, beta2\)"),
    (lambda: mc.nn.Adam([_param()], eps=float("inf")), r"eps must be a finite number, got inf"),
    (lambda: mc.nn.Adagrad([_param()], weight_decay=-1), r"weight_decay must be >= 0"),
    (lambda: mc.nn.SGD(_param(), lr=0.1), r"params must be a list of parameters .*got Parameter"),
    (lambda: mc.nn.SGD(None, lr=0.1), r"params must be a list of parameters .*got NoneType"),
    (lambda: mc.nn.Adam([]), r"Adam: got an empty list of parameters"),
    (lambda: mc.nn.Adam(p for p in []), r"Adam: got an empty list of parameters"),
])
def test_optimiser_arguments_are_checked(make, message):
    with pytest.raises(mc.ArgumentError, match=message):
        make()


def test_hyperparameters_changed_later_are_checked_at_the_step():
    p = _param()
    opt = mc.nn.SGD([p], lr=0.1)
    p.grad = mc.tensor(np.ones(3, np.float32))
    opt.lr = float("nan")
    with pytest.raises(mc.ArgumentError, match="SGD: lr must be a finite number, got nan"):
        opt.step()
    assert (p.numpy() == 1).all()  # nothing was updated
    with pytest.raises(mc.ArgumentError, match=r"clip_grad_norm: max_norm must be > 0"):
        mc.nn.clip_grad_norm([p], 0)


def test_a_loaded_optimiser_state_with_bad_hyperparameters_is_refused():
    p = _param()
    opt = mc.nn.Adam([p])
    state = opt.state_dict()
    state["hyperparameters"]["lr"] = float("nan")
    with pytest.raises(mc.CheckpointError, match="hyperparameter lr must be a finite number"):
        opt.load_state_dict(state)
    assert opt.lr == 1e-3


# --- the command line: every flag is checked before any data is read ---------------------------

@pytest.mark.parametrize("flags, message", [
    (["--epochs", "-1"], "argument --epochs: must be >= 0, got -1"),
    (["--threads", "0"], "argument --threads: must be >= 1, got 0"),
    (["--batch-size", "0"], "argument --batch-size: must be >= 1, got 0"),
    (["--hidden", "-4"], "argument --hidden: must be >= 1, got -4"),
    (["--embed-dim", "x"], "argument --embed-dim: must be an integer, got 'x'"),
    (["--lr", "nan", "--save", ""], "argument --lr: must be a finite number, got nan"),
    (["--lr", "0"], "argument --lr: must be > 0, got 0"),
    (["--seed", "-1"], r"argument --seed: must be in [0, 4294967295], got -1"),
    (["--sizes", "1,2"], "argument --sizes: expected three positive sizes"),
    (["--device", "tpu"], "argument --device: invalid choice: 'tpu'"),
])
def test_bad_flags_of_the_main_job_stop_it_before_it_starts(flags, message, capsys):
    with pytest.raises(SystemExit) as info:
        main(["train", "tree-lstm", *flags])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("save, message", [
    ("/proc/minicavs.npz", "--save '/proc/minicavs.npz' cannot be written"),
    (".", "--save must be a file path, not a directory"),
])
def test_an_unwritable_save_path_stops_the_main_job_before_training(tmp_path, monkeypatch,
                                                                    capsys, save, message):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "tree-lstm", "--save", save, "--sizes", "8,8,8",
                 "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert message in out and "epoch" not in out and "train / dev / test" not in out


def test_every_flag_of_the_examples_is_checked(capsys):
    """Each example parses its flags with the shared checks; a bad value exits with status 2
    and says which flag and why."""
    import importlib.util

    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
    bad = {"tree_lstm": ["--train-size", "0"], "child_sum_tree_lstm": ["--epochs", "-1"],
           "tree_fc": ["--leaves", "6"], "var_lstm_lm": ["--sentences", "3"],
           "fixed_lstm_lm": ["--steps", "0"], "seq2seq": ["--vocab-size", "3"],
           "td_tree_lstm": ["--max-vertices", "0"]}
    expected = {"tree_lstm": "--train-size: must be >= 1, got 0",
                "child_sum_tree_lstm": "--epochs: must be >= 0, got -1",
                "tree_fc": "--leaves: must be a power of two, got 6",
                "var_lstm_lm": "--sentences: must be >= 10, got 3",
                "fixed_lstm_lm": "--steps: must be >= 1, got 0",
                "seq2seq": "--vocab-size: must be >= 4, got 3",
                "td_tree_lstm": "--max-vertices: must be >= 1, got 0"}
    for name, flags in bad.items():
        spec = importlib.util.spec_from_file_location(name, os.path.join(root, f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        with pytest.raises(SystemExit) as info:
            module.parse_args(flags)
        assert info.value.code == 2, name
        assert expected[name] in capsys.readouterr().err, name
        for common in (["--clip", "-1"], ["--lr", "inf"], ["--threads", "0"]):
            if common[0] == "--clip" and name in ("tree_lstm", "child_sum_tree_lstm", "tree_fc"):
                continue  # the tree models take no --clip
            with pytest.raises(SystemExit):
                module.parse_args(common)
            assert f"argument {common[0]}: must be" in capsys.readouterr().err, (name, common)


def test_an_example_reports_a_data_error_without_a_traceback(tmp_path, capsys):
    def main(argv):
        data.read_ptb(tmp_path / "missing.txt")
    with pytest.raises(SystemExit) as info:
        training.command_line(main, [])
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert "error: " in err and "missing.txt: cannot read it" in err and "Traceback" not in err


def test_the_training_loop_checks_its_arguments():
    with pytest.raises(mc.ArgumentError, match="fit: epochs must be >= 0, got -1"):
        training.fit(None, None, [], epochs=-1, batch_size=4)
    with pytest.raises(mc.ArgumentError, match="fit: batch_size must be >= 1, got 0"):
        training.fit(None, None, [], epochs=1, batch_size=0)
    with pytest.raises(mc.ArgumentError, match="minibatches: batch_size must be an integer"):
        training.minibatches([1, 2], 1.5)


def test_flag_types_build_on_the_argument_checks():
    parse = validate.count(minimum=1)
    assert parse("3") == 3
    with pytest.raises(argparse.ArgumentTypeError, match="must be >= 1, got 0"):
        parse("0")
    assert validate.real(minimum=0, open_minimum=True)("1e-3") == 1e-3
    with pytest.raises(argparse.ArgumentTypeError, match="must be a number, got 'fast'"):
        validate.real()("fast")
    assert isinstance(build_parser(), argparse.ArgumentParser)


# --- data that gives nothing to train on, and options that would fail after the run -----------

def test_the_main_job_names_a_data_folder_that_does_not_exist(tmp_path, capsys):
    assert main(["train", "tree-lstm", "--data", str(tmp_path / "nowhere"), "--save", "",
                 "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert "nowhere: does not exist" in out and "missing SST file" not in out


def test_sst_of_one_word_trees_is_refused_as_nothing_to_train_on(tmp_path, capsys):
    for name in ("train", "dev", "test"):
        (tmp_path / f"{name}.txt").write_text("(3 good)\n(1 bad)\n")
    assert main(["train", "tree-lstm", "--data", str(tmp_path), "--save", "",
                 "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert "nothing to train on: the 2 training samples give TreeLSTMClassifier no target" in out
    assert "epoch" not in out and "test root accuracy" not in out
    assert main(["train", "tree-lstm", "--data", str(tmp_path), "--save", "", "--epochs", "1",
                 "--no-progress", "--leaf-loss"]) == 0  # the leaves' labels: something to learn


def _example_parser(name):
    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
    spec = importlib.util.spec_from_file_location(name, os.path.join(root, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.parse_args


@pytest.mark.parametrize("name", ["tree_lstm", "var_lstm_lm"])
def test_a_plot_that_could_not_be_written_is_refused_before_the_run(name, tmp_path, capsys,
                                                                    monkeypatch):
    parse_args = _example_parser(name)
    with pytest.raises(SystemExit) as info:
        parse_args(["--plot", str(tmp_path / "no-such-folder" / "curves.png")])
    assert info.value.code == 2
    assert "argument --plot: the folder" in capsys.readouterr().err
    find_spec = importlib.util.find_spec  # as if matplotlib were not installed:
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda module, *a: None if module == "matplotlib" else find_spec(module, *a))
    with pytest.raises(SystemExit):
        parse_args(["--plot", str(tmp_path / "curves.png")])
    assert "needs matplotlib, which is not installed" in capsys.readouterr().err
