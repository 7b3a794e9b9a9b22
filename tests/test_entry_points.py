"""Every example and benchmark entry point runs from a bare clone: on embedded synthetic data by
default, on real data only with ``--data``; a missing path is refused before any work, and a
benchmark run that measured nothing writes nothing."""

import importlib.util
import pathlib
import re
from collections import Counter

import pytest

from minicavs.data import DataError
from minicavs.models.plain import majority_tag_rate, synthetic_tagged

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _example(name):
    spec = importlib.util.spec_from_file_location(f"example_{name}", ROOT / "examples" /
                                                  f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_synthetic_tags_are_fixed_by_the_seed_and_learnable():
    train, test = synthetic_tagged(300, seed=0), synthetic_tagged(100, seed=1)
    assert train == synthetic_tagged(300, seed=0) and train != test
    tags = {tag for sentence in train + test for _, tag in sentence}
    assert tags == {"DET", "NOUN", "ADJ", "AUX", "VERB", "PART", "ADV", "CCONJ", "PROPN"}
    # Learnable: each known word has one tag, and a name is capitalised (the rare words the
    # character model reads), so the training tags of a word and that rule tag all of test.
    seen = {}
    for sentence in train:
        for word, tag in sentence:
            assert seen.setdefault(word, tag) == tag, word
    guess = [seen.get(w, "PROPN" if w[0].isupper() else "?") for s in test for w, _ in s]
    gold = [t for s in test for _, t in s]
    assert guess == gold
    # ... and not by chance: the most frequent tag covers about a fifth of the words.
    assert 0.15 < majority_tag_rate(test) < 0.3
    names = Counter(w for s in train for w, t in s if t == "PROPN")
    assert names and sum(n < 5 for n in names.values()) > len(names) / 2  # mostly rare


@pytest.mark.parametrize("task", ["tagger", "treelstm"])
def test_the_autobatch_example_runs_on_embedded_data(task, capsys):
    result = _example("autobatch").main(["--task", task, "--train-size", "12", "--test-size",
                                         "6", "--hidden", "6", "--embed-dim", "6",
                                         "--batch-size", "6", "--no-progress"])
    assert 0.0 <= result["accuracy"] <= 1.0 and 0.0 < result["chance"] < 1.0
    out = capsys.readouterr().out.strip().splitlines()
    assert "synthetic" in out[0]
    assert out[-1].startswith(f"{task} (agenda+): held-out") and "chance" in out[-1]


def test_the_autobatch_example_refuses_a_missing_tags_folder_before_work(tmp_path):
    (tmp_path / "dev.txt").write_text("The|DET film|NOUN\n")
    with pytest.raises(DataError, match=r"test.txt is missing"):
        _example("autobatch").main(["--data", str(tmp_path)])
    with pytest.raises(DataError, match="no: does not exist"):
        _example("autobatch").main(["--task", "treelstm", "--data", str(tmp_path / "no")])


def test_the_autobatch_example_reads_a_tags_folder(tmp_path, capsys):
    for name in ("dev.txt", "test.txt"):
        (tmp_path / name).write_text("The|DET film|NOUN is|AUX good|ADJ\nIt|PRON ends|VERB\n")
    result = _example("autobatch").main(["--data", str(tmp_path), "--hidden", "4",
                                         "--embed-dim", "4", "--no-progress"])
    assert result["chance"] == pytest.approx(1 / 6)
    assert f"from tagged sentences from {tmp_path}" in capsys.readouterr().out


# --- benchmarks ------------------------------------------------------------------------------

def test_benchmark_workloads_default_to_synthetic_data():
    from benchmarks import common

    trees = common.load_workload("tree_lstm", 8)
    assert trees["num_samples"] == 8 and "synthetic" in trees["source"]
    lm = common.load_workload("var_lstm", 8)
    assert lm["num_samples"] == 8 and "synthetic" in lm["source"]
    assert all(s[-1] == lm["eos"] for batch in lm["batches"] for s in batch)
    assert common.missing_data(["tree_lstm", "tree_fc", "var_lstm"]) == []


def test_benchmark_refuses_missing_data_before_work(tmp_path):
    from benchmarks import run

    with pytest.raises(SystemExit, match="not a folder"):
        run.parse_args(["--quick", "--data", str(tmp_path / "none")])
    with pytest.raises(SystemExit, match=r"tree_lstm reads .*sst/train.txt, which is not a"):
        run.parse_args(["--quick", "--data", str(tmp_path)])
    (tmp_path / "sst").mkdir()
    (tmp_path / "sst" / "train.txt").write_text("(2 (2 a) (2 b))\n")
    args = run.parse_args(["--quick", "--workloads", "tree_lstm", "--data", str(tmp_path)])
    assert args.sst == str(tmp_path / "sst" / "train.txt")


def test_a_benchmark_that_measured_nothing_is_not_a_result():
    from benchmarks import run

    report = {"workloads": [{"results": {"minicavs-cuda": {"missing": "no GPU"}}}],
              "ablation": {"tree_lstm_256": {"all on": {"missing": "no GPU"}}}}
    assert not run._measured_anything(report)
    report["workloads"][0]["results"]["x"] = {"throughput": 1.0}
    assert run._measured_anything(report)


def test_the_c_reference_is_built_for_the_avx2_build_s_target_where_one_is_asked_for(
        monkeypatch):
    """An AVX2 build of minicavs (``MINICAVS_MARCH``) is compared with the C reference built
    for that target, as it would be on such a CPU; else the reference's own flags."""
    from benchmarks.peers import c_reference

    monkeypatch.delenv("MINICAVS_MARCH", raising=False)
    assert c_reference.flags() == c_reference.FLAGS
    monkeypatch.setenv("MINICAVS_MARCH", "x86-64-v3")
    flags = c_reference.flags()
    assert "-march=x86-64-v3" in flags and "-march=native" not in flags
    assert not any(f.startswith("-mprefer-vector-width") for f in flags)
    assert set(c_reference.FLAGS) - set(flags) == {"-march=native", "-mprefer-vector-width=512"}


def test_benchmark_rounds_keep_each_systems_fastest_and_list_every_round():
    from benchmarks import run

    kept = run._faster(None, {"throughput": 10.0, "epoch_seconds": [0.2]})
    kept = run._faster(kept, {"error": "killed"})  # a failed round loses to a measured one
    kept = run._faster(kept, {"throughput": 12.5, "epoch_seconds": [0.16]})
    kept = run._faster(kept, {"throughput": 11.0, "epoch_seconds": [0.18]})
    assert kept["throughput"] == 12.5 and kept["epoch_seconds"] == [0.16]
    assert kept["round_throughputs"] == [10.0, None, 12.5, 11.0]
    assert "error" not in run._faster({"error": "x"}, {"throughput": 1.0})
    with pytest.raises(SystemExit, match="--rounds 0"):
        run.parse_args(["--quick", "--rounds", "0"])

    from benchmarks import common

    entry = {"title": "Tree-LSTM", "hidden": 8, "source": "synthetic", "units": 64,
             "unit": "trees/s", "flops": {"total": 1e9},
             "results": {"minicavs": dict(kept, best_epoch_seconds=0.16),
                         "torch-batched": {"throughput": 8.0, "best_epoch_seconds": 0.25,
                                           "round_throughputs": [8.0]}}}
    table = common.throughput_table(entry, 1e11)
    assert "trees/s of each round" in table
    assert "minicavs: 10 / failed / 12 / 11" in table  # (one round: no spread line)
    assert "torch-batched: 8" not in table and "1.56×" in table


# A worker of run_in_turns: its setup and each of three epochs a turn; writes when each turn
# began and ended (``fail``: exits at its second epoch; ``hang``: sleeps through it).
_TURN_WORKER = """
import json, sys, time
from benchmarks import common
name, log, out = sys.argv[1], sys.argv[2], sys.argv[-1]
spans = []
common.take_turn()  # (setup)
for epoch in range(3):
    common.take_turn()
    began = time.time()
    if name == "fail" and epoch == 1:
        sys.exit("failed on purpose")
    time.sleep(5 if name == "hang" and epoch == 1 else 0.02)
    spans.append((began, time.time()))
    with open(log, "a") as f:
        f.write(json.dumps([name, epoch, began, time.time()]) + "\\n")
with open(out, "w") as f:
    json.dump({"throughput": 1.0, "spans": spans}, f)
"""


def test_benchmark_systems_take_turns_an_epoch_each_and_never_run_at_once(tmp_path):
    import json

    from benchmarks import common

    log = tmp_path / "turns.log"
    jobs = [(name, ["-c", _TURN_WORKER, name, str(log)], {}) for name in ("a", "b", "fail", "c")]
    results = common.run_in_turns(jobs, threads=1, timeout=60, settle_seconds=0.01)
    assert set(results) == {"a", "b", "fail", "c"}
    assert "failed on purpose" in results["fail"]["error"]
    assert all(results[n]["throughput"] == 1.0 for n in "abc")
    turns = [json.loads(line) for line in log.read_text().splitlines()]
    # one epoch each in turn, in the jobs' order, the failed one dropping out
    assert [(n, e) for n, e, _, _ in turns] == [
        ("a", 0), ("b", 0), ("fail", 0), ("c", 0), ("a", 1), ("b", 1), ("c", 1),
        ("a", 2), ("b", 2), ("c", 2)]
    spans = sorted((began, ended) for _, _, began, ended in turns)
    assert all(ended <= next_began for (_, ended), (next_began, _) in zip(spans, spans[1:]))

    # a turn past the timeout is ended, and the others go on
    hang = [(name, ["-c", _TURN_WORKER, name, str(tmp_path / "hang.log")], {})
            for name in ("a", "hang")]
    results = common.run_in_turns(hang, threads=1, timeout=1, settle_seconds=0.01)
    assert "more than 1 s" in results["hang"]["error"]
    assert results["a"]["throughput"] == 1.0


def test_an_ablation_run_in_turns_reads_each_variant_against_its_own_rounds():
    """In turns, a variant's epoch i is divided by the mean all-on epoch of round i (the same
    minutes) and the median taken: one fast epoch of a variant in a noisy hour is no effect,
    where its best epoch against the best all-on epoch would read 1.25x."""
    from benchmarks import common

    first = {"epoch_seconds": [0.30, 0.30, 0.30], "best_epoch_seconds": 0.30, "throughput": 1.0}
    last = {"epoch_seconds": [0.31, 0.30, 0.33], "best_epoch_seconds": 0.30, "throughput": 1.0}
    lucky = {"epoch_seconds": [0.31, 0.24, 0.30], "best_epoch_seconds": 0.24, "throughput": 1.25}
    slower = {"epoch_seconds": [0.60, 0.63, 0.57], "best_epoch_seconds": 0.57, "throughput": 0.5}
    short = {"epoch_seconds": [0.3], "best_epoch_seconds": 0.3, "throughput": 1.0}  # (not paired)
    variants = {"cse off": lucky, "fuse off": slower, "dce off": short}
    drift = common.pair_rounds(first, last, variants)
    assert drift == pytest.approx(1 / 30)  # rounds 0.30/0.31, 0.30/0.30, 0.30/0.33: median
    assert lucky["paired_ratio"] == pytest.approx(0.30 / 0.315)  # (0.31/0.305, 0.24/0.30, ...)
    assert slower["paired_ratio"] == pytest.approx(0.60 / 0.305)
    assert "paired_ratio" not in short
    reference = dict(common.ablation_reference(first, last), paired_drift=drift)
    table = common.ablation_table({"tree_lstm": {"all on": reference, **variants}})
    assert "cse off" in table and "no measurable effect" in table.split("cse off")[1].split("\n")[0]
    assert "buys 1.97×" in table.split("fuse off")[1].split("\n")[0]
    assert "the same round, the median over the rounds" in table
    assert "Where the defaults cost" not in table  # (the lucky epoch is not a cost)
    assert common.pair_rounds(first, {"epoch_seconds": [0.3]}, {}) is None


def test_benchmark_cuda_without_a_gpu_is_refused_and_writes_nothing(tmp_path):
    from benchmarks import run
    from minicavs.backend import gpu_available

    if gpu_available():
        pytest.skip("a GPU is visible: --cuda would run")
    out = tmp_path / "results"
    with pytest.raises(SystemExit, match="no GPU system can run here"):
        run.main(["--cuda", "--out", str(out), "--systems", "minicavs-cuda"])
    assert not out.exists()


def test_autobatch_table_on_the_gpu_measures_the_device_and_compares_with_the_paper():
    from benchmarks import autobatch_table

    import os
    from types import SimpleNamespace

    # A :cuda system in its own process, on the emulated device (chosen when CuPy is first
    # asked for, so not in this process).
    env = dict(os.environ, MINICAVS_CUDA_EMULATE="1", PYTHONPATH=str(autobatch_table.ROOT))
    times = autobatch_table.run_worker("minicavs-agenda+:cuda", "tagger",
                                       SimpleNamespace(batches=1, threads=1), env)
    assert len(times) == 1 and times[0] > 0
    table = {("tagger", "minicavs-agenda+:cuda"): 1602.0, ("tagger", "minicavs-agenda+"): 801.0}
    text = autobatch_table.render(table, ["tagger"], ["minicavs-agenda+:cuda", "minicavs-agenda+",
                                                      "dynet-agenda"])
    assert "minicavs-agenda+:cuda ÷ minicavs-agenda+" in text
    assert "÷ minicavs-agenda " not in text  # a ratio only where the table has both systems
    assert text.splitlines()[-1] == "| tagger | 1602.0 | 801.0 | - | - | 2.00× | 2.00× |"
    with pytest.raises(SystemExit, match="DyNet build runs on the CPU only"):
        autobatch_table.worker("dynet-agenda:cuda", "tagger", 1, 1)


def test_cuda_profile_says_whether_host_or_device_sets_a_steps_pace():
    import os
    import subprocess
    import sys

    from benchmarks import autobatch_table

    # On the emulated device (a subprocess: chosen when CuPy is first asked for) the host's
    # times are real; the kernel table needs a GPU and says why it is left out.
    env = dict(os.environ, MINICAVS_CUDA_EMULATE="1", PYTHONPATH=str(autobatch_table.ROOT))
    run = subprocess.run([sys.executable, str(autobatch_table.ROOT / "benchmarks" /
                                              "cuda_profile.py"),
                          "--workloads", "tree_rnn,autobatch:tagger:agenda", "--size", "64",
                          "--steps", "1", "--warmup", "1"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    for name in ("tree_rnn", "autobatch:tagger:agenda"):
        head = next(line for line in lines if line.startswith(name + ":"))
        issued, finished = (float(x) for x in
                            re.findall(r"in ([0-9.]+) ms, the device finishes it at ([0-9.]+)",
                                       head)[0])
        assert 0 < issued <= finished
    assert run.stdout.count("no kernel table") == 2


def test_cuda_launches_tables_launches_host_time_and_who_issued_the_levels():
    import os
    import subprocess
    import sys

    from benchmarks import autobatch_table

    # On the emulated device: launches and host µs per level step, and the issuer of each
    # model's levels (C for both); without a GPU or the emulated device it says how to run it.
    script = str(autobatch_table.ROOT / "benchmarks" / "cuda_launches.py")
    env = dict(os.environ, MINICAVS_CUDA_EMULATE="1", PYTHONPATH=str(autobatch_table.ROOT))
    run = subprocess.run([sys.executable, script, "--workloads", "tree_lstm,rntn", "--size",
                          "16", "--steps", "2", "--hidden", "4"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    row = next(line for line in run.stdout.splitlines() if line.startswith("tree_lstm "))
    assert float(row.split()[3]) <= 3 and float(row.split()[4]) <= 5, row
    assert "tree_lstm: cupy (levels issued from C) / cupy (levels issued from C)" in run.stdout
    assert "rntn: cupy (levels issued from C) / cupy (levels issued from C)" in run.stdout
    if not os.environ.get("MINICAVS_CUDA_EMULATE"):
        from minicavs.backend import gpu_available

        if not gpu_available():
            env.pop("MINICAVS_CUDA_EMULATE")
            run = subprocess.run([sys.executable, script], env=env, capture_output=True,
                                 text=True, timeout=120)
            assert run.returncode == 1 and "MINICAVS_CUDA_EMULATE=1" in run.stderr, run.stderr


def test_autobatch_batch_cost_times_a_batch_both_ways(capsys):
    # The interpreter's run of an LSTM step's batch against its native calls made directly:
    # the direct calls must give the interpreter's values (the script checks them), and the
    # table has a row per row count. (No timing asserted: the machine is shared.)
    from minicavs.cpu import kernels

    if kernels.library() is None:
        pytest.skip("no native code here: the direct side is the native kernels' calls")
    from benchmarks import autobatch_batch_cost

    autobatch_batch_cost.main(["--rows", "1,5", "--inputs", "6", "--hidden", "4",
                               "--repeats", "2"])
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert [r[0] for r in rows] == ["1", "5"] and all(len(r) == 4 for r in rows), rows


def test_the_machine_is_named_in_benchmark_reports():
    from benchmarks import common

    text = common.cpu_description()
    assert text.endswith(" cores") and any(isa in text for isa in ("AVX", "ISA", "no AVX"))


# --- interrupted runs and command-line wording -----------------------------------------------

def test_ctrl_c_in_the_main_job_says_where_the_checkpoint_is(tmp_path, monkeypatch, capsys):
    from types import SimpleNamespace

    from minicavs import train_command
    from minicavs.__main__ import main

    def fit_then_interrupt(*args, on_epoch_end, **kwargs):
        on_epoch_end(1, SimpleNamespace(loss=1.0), {})  # epoch 1 saved, then Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(train_command, "fit", fit_then_interrupt)
    save = tmp_path / "run.npz"
    status = main(["train", "tree-lstm", "--sizes", "8,4,4", "--hidden", "4", "--embed-dim", "4",
                   "--save", str(save), "--no-progress"])
    out = capsys.readouterr().out.strip().splitlines()
    assert status == 130 and save.is_file()
    assert out[-1] == (f"minicavs train: interrupted; the checkpoint of epoch 1 is safe at "
                       f"{save} (written atomically); continue with --resume {save}")
    assert "no epoch had finished" in train_command.interrupted_note("x.npz", None)


def test_examples_end_an_interrupt_with_one_line_and_name_the_flag(capsys):
    from minicavs.errors import MinicavsError
    from minicavs.training import command_line

    def interrupted(argv):
        raise KeyboardInterrupt

    def no_gpu(argv):
        raise MinicavsError("device 'cuda' needs a GPU; run on one, or use set_device('cpu')")

    with pytest.raises(SystemExit) as stop:
        command_line(interrupted, [])
    assert stop.value.code == 130
    assert capsys.readouterr().err.strip().endswith("interrupted (the examples save no "
                                                    "checkpoint; the main job, python -m "
                                                    "minicavs train, does)")
    with pytest.raises(SystemExit):
        command_line(no_gpu, [])
    assert "or pass --device cpu" in capsys.readouterr().err


def test_training_curves_mark_whole_epochs_only(tmp_path, monkeypatch):
    matplotlib = pytest.importorskip("matplotlib", reason="--plot needs matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from types import SimpleNamespace

    from minicavs.training import plot_history

    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    history = [(SimpleNamespace(loss=1.0 / e), {"loss": 1.2 / e, "fine": 0.1 * e})
               for e in (1, 2, 3)]
    assert plot_history({"seed 0": history}, tmp_path / "curves.png", "fine", log=lambda m: None)
    (figure,) = figures
    figure.canvas.draw()
    for axes in figure.axes:
        low, high = axes.get_xlim()
        ticks = [t for t in axes.get_xticks() if low <= t <= high]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks


def test_import_minicavs_leaves_scipy_until_an_op_needs_it():
    """``import minicavs`` is every entry point's first step (and every test subprocess's):
    SciPy, a fifth of it, is imported where erf or the sparse scatter-add first needs it."""
    import subprocess
    import sys

    code = ("import sys; import numpy as np; import minicavs as mc\n"
            "assert not [m for m in sys.modules if m.startswith('scipy')], 'scipy imported'\n"
            "x = mc.tensor(np.array([0.0, 0.5], np.float32))\n"
            "assert abs(float(mc.erf(x).numpy()[1]) - 0.5204999) < 1e-6\n"
            "assert 'scipy.special' in sys.modules\n"
            "print('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
