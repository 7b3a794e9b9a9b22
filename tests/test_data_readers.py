"""The SST and PTB readers, the Tree helpers, the Vocabulary and the SST metrics.

Every file these tests read is written by the tests themselves (into tmp_path); only the last
test looks at the real SST folder, and it skips, saying why, where that folder is absent.
"""

import re
from pathlib import Path

import numpy as np
import pytest

from minicavs.data import (DataError, Tree, Vocabulary, batch_sentences, binary_accuracy,
                           fine_grained_accuracy, load_ptb, load_sst, pad_batch, parse_tree,
                           read_ptb, read_sst, root_labels, to_binary)
from minicavs.errors import IndexRangeError, MinicavsError, ShapeError

SST_LINES = [
    "(3 (2 (2 The) (2 Rock)) (4 (3 (2 is) (4 great)) (2 .)))",
    "(2 word)",
    "(1 (2 -LRB-) (1 (1 (2 not) (3 good)) (2 -RRB-)))",
    "(0 (2 It) (0 (2 's) (0 (1 dull) (2 8\xa01\\/2))))",  # SST's no-break space inside a word
]


def write(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def sst_dir(tmp_path):
    write(tmp_path / "train.txt", SST_LINES + ["(4 (4 great) (2 word))"])
    write(tmp_path / "dev.txt", ["(3 (2 The) (3 unseen))"])
    write(tmp_path / "test.txt", ["(2 (2 the) (2 word))", "(4 great)"])
    return tmp_path


# -- parsing ---------------------------------------------------------------------------------

def test_parse_numbers_children_first_root_last_leaves_in_sentence_order():
    tree = parse_tree(SST_LINES[0])
    assert tree.children == [[], [], [0, 1], [], [], [3, 4], [], [5, 6], [2, 7]]
    assert tree.tokens == ["The", "Rock", "is", "great", "."]
    assert tree.labels.tolist() == [2, 2, 2, 2, 4, 3, 2, 4, 3]
    assert tree.words.tolist() == [-1] * 9  # no vocabulary given: not encoded yet
    assert tree.root == 8 and tree.num_vertices == 9 and tree.num_leaves == 5
    assert tree.leaves().tolist() == [0, 1, 3, 4, 6]
    assert tree.parents().tolist() == [2, 2, 8, 5, 5, 7, 7, 8, -1]
    assert tree.levels().tolist() == [0, 0, 1, 0, 0, 1, 0, 2, 3]
    assert tree.height() == 3


@pytest.mark.parametrize("line", SST_LINES)
def test_to_string_prints_the_parsed_line_back(line):
    assert parse_tree(line).to_string() == line


def test_single_word_sentence_is_one_vertex():
    tree = parse_tree("(2 word)")
    assert tree.children == [[]] and tree.labels.tolist() == [2] and tree.tokens == ["word"]
    assert tree.height() == 0 and tree.parents().tolist() == [-1]


def test_escaped_brackets_and_odd_words_are_ordinary_words():
    tree = parse_tree(SST_LINES[2])
    assert tree.tokens == ["-LRB-", "not", "good", "-RRB-"]
    tree = parse_tree("(2 (2 1990) (2 ...))")  # a number where a word goes is a word
    assert tree.tokens == ["1990", "..."] and tree.labels.tolist() == [2, 2, 2]
    assert parse_tree(SST_LINES[3]).tokens[-1] == "8\xa01\\/2"


def test_unary_chains_collapse_to_one_vertex_keeping_the_outer_label():
    tree = parse_tree("(1 (2 (3 word)))")
    assert tree.children == [[]] and tree.labels.tolist() == [1]
    tree = parse_tree("(4 (3 (2 (2 a) (2 b))) (2 (1 c)))")
    assert tree.children == [[], [], [0, 1], [], [2, 3]]
    assert tree.labels.tolist() == [2, 2, 3, 2, 4]


def test_unary_chains_kept_on_request():
    tree = parse_tree("(1 (2 (3 word)))", collapse_unary=False)
    assert tree.children == [[], [0], [1]] and tree.labels.tolist() == [3, 2, 1]
    line = "(4 (3 (2 (2 a) (2 b))) (2 (1 c)))"
    assert parse_tree(line, collapse_unary=False).to_string() == line


def test_deep_tree_needs_no_recursion():
    depth = 10_000  # far beyond Python's recursion limit
    line = "(1 " * (depth - 1) + "(2 w0)" + "".join(f" (2 w{i}))" for i in range(1, depth))
    tree = parse_tree(line)
    assert tree.num_vertices == 2 * depth - 1 and tree.height() == depth - 1
    assert tree.tokens[:3] == ["w0", "w1", "w2"] and tree.leaves()[-1] == tree.root - 1
    assert tree.to_string() == line
    assert Tree(tree.children, tree.words, tree.labels, tree.tokens) == tree  # validates


@pytest.mark.parametrize("line, where, expected", [
    ("(3 (2 a) (2 b)", ":1:1:", "never closed (1 ')' missing)"),
    ("(3 (2 a) (2 b)))", ":1:16:", "unmatched ')'"),
    ("(x (2 a))", ":1:2:", "expected an integer label after '(', found 'x'"),
    ("(2 a b)", ":1:6:", "expected ')' after the word 'a'"),
    ("(3 (2 a) word)", ":1:10:", "found the word 'word' inside a node"),
    ("(3 )", ":1:4:", "empty node"),
    ("word", ":1:1:", "found the word 'word' before the tree"),
    ("(2 a) (2 b)", ":1:7:", "after the end of the tree"),
    ("(2 a) b", ":1:7:", "found the word 'b' after the end of the tree"),
    ("(2", ":1:3:", "found the end of the line"),
])
def test_malformed_trees_raise_with_position(line, where, expected):
    with pytest.raises(DataError) as info:
        parse_tree(line, source="t.txt")
    message = str(info.value)
    assert message.startswith("t.txt" + where) and expected in message, message


def test_file_errors_name_the_file_and_line(tmp_path):
    path = write(tmp_path / "bad.txt", [SST_LINES[0], "", "(2 (2 a) (2 b)"])
    with pytest.raises(DataError, match=r"bad\.txt:3:1: the node opened here is never closed"):
        read_sst(path)
    assert issubclass(DataError, MinicavsError) and issubclass(DataError, ValueError)


def test_sst_labels_outside_0_to_4_are_refused_with_file_line_and_column(tmp_path):
    path = tmp_path / "train.txt"
    path.write_text("(3 (2 a) (4 b))\n(2 (9 good) (2 film))\n")
    with pytest.raises(DataError, match=r"train.txt:2:5: label 9 is out of range "
                                             r"\(valid: 0..4\)"):
        read_sst(path)
    assert len(read_sst(path, num_labels=10)) == 2  # another treebank's labels


@pytest.mark.parametrize("reader", ["sst", "ptb", "vocabulary", "tags", "vectors"])
def test_files_that_are_not_utf8_name_the_file_line_and_byte(tmp_path, reader):
    path = tmp_path / "file.txt"
    path.write_bytes(GOOD_FIRST_LINE[reader] + "(2 caf\u00e9)\n".encode("latin-1"))
    read = READERS[reader]
    with pytest.raises(DataError, match=r"file.txt:2:7: byte 0xe9 is not UTF-8 text; the "
                                             r"file must be UTF-8"):
        read(path)


def test_a_missing_file_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match=r"nothing.txt: cannot read it: No such file"):
        read_ptb(tmp_path / "nothing.txt")


def test_read_sst_skips_blank_lines_and_encodes_with_a_vocabulary(tmp_path):
    path = write(tmp_path / "t.txt", ["", SST_LINES[0], "   ", SST_LINES[1]])
    vocab = Vocabulary(["The", "great"])
    trees = read_sst(path, vocab)
    assert len(trees) == 2
    assert trees[0].words.tolist() == [1, 0, -1, 0, 2, -1, 0, -1, -1]  # unknowns -> 0


def test_load_sst_builds_the_vocabulary_from_train_only(sst_dir):
    train, dev, test, vocab = load_sst(sst_dir)
    assert (len(train), len(dev), len(test)) == (5, 1, 2)
    assert "unseen" not in vocab and "word" in vocab
    assert dev[0].words[dev[0].leaves()].tolist() == [vocab.lookup("The"), 0]
    assert vocab.tokens[:3] == ["<unk>", "great", "word"]  # by count, then alphabetical
    assert root_labels(test).tolist() == [2, 4]
    rare = load_sst(sst_dir, min_count=2).vocab
    assert rare.tokens == ["<unk>", "great", "word"]
    lower = load_sst(sst_dir, lowercase=True).vocab
    assert lower.lookup("THE") == lower.lookup("the") != 0


def test_load_sst_names_missing_files(tmp_path):
    write(tmp_path / "train.txt", SST_LINES)
    with pytest.raises(DataError, match="missing SST file.*dev.txt, test.txt"):
        load_sst(tmp_path)


# -- what every text reader refuses or accepts (minicavs/data/files.py) -------------------------

def _vectors(path):
    from minicavs.data import load_word_vectors
    return load_word_vectors(path, Vocabulary(["a", "b"]), np.zeros((3, 2)))


def _tagged(path):
    from minicavs.models.plain import read_tagged
    return read_tagged(path)


READERS = {"sst": read_sst, "ptb": read_ptb, "vocabulary": Vocabulary.load, "tags": _tagged,
           "vectors": _vectors}
GOOD_FIRST_LINE = {"sst": b"(2 (2 a) (3 b))\n", "ptb": b"a b c\n", "vocabulary": b"<unk>\n",
                   "tags": b"a|DT b|NN\n", "vectors": b"a 0.5 1.5\n"}


@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_text_reader_takes_a_byte_order_mark_and_refuses_binary_files(tmp_path, reader):
    plain, marked = tmp_path / "plain.txt", tmp_path / "marked.txt"
    plain.write_bytes(GOOD_FIRST_LINE[reader])
    marked.write_bytes(b"\xef\xbb\xbf" + GOOD_FIRST_LINE[reader])  # what Windows editors write
    read = READERS[reader]
    first, again = read(plain), read(marked)
    if reader == "vocabulary":
        first, again = first.tokens, again.tokens
    elif reader == "sst":
        first, again = [t.to_string() for t in first], [t.to_string() for t in again]
    assert again == first
    binary = tmp_path / "binary.txt"
    binary.write_bytes(GOOD_FIRST_LINE[reader] + b"PK\x03\x04\x00\x00\n")
    with pytest.raises(DataError, match=r"binary.txt:2:5: a NUL byte: this is a binary file, "
                                        r"not text"):
        read(binary)


def test_the_ptb_reader_strips_the_mark_from_the_first_word(tmp_path):
    path = tmp_path / "ptb.valid.txt"
    path.write_bytes("\ufeffthe cat\n".encode("utf-8"))
    assert read_ptb(path) == [["the", "cat", "<eos>"]]


@pytest.mark.parametrize("lines", [[], ["", "  ", ""]])
def test_a_ptb_file_without_a_word_is_refused(tmp_path, lines):
    path = tmp_path / "ptb.train.txt"
    path.write_text("\n".join(lines))
    with pytest.raises(DataError, match=r"ptb.train.txt: no words in it \(\d blank line\(s\)\): "
                                        r"nothing to train on or evaluate"):
        read_ptb(path)


@pytest.mark.parametrize("label", ["\u0663", "+3", "3_0", "\uff13"])
def test_sst_labels_are_ascii_digits(tmp_path, label):
    path = tmp_path / "train.txt"
    path.write_text(f"(3 (2 a) (4 b))\n({label} (2 good) (2 film))\n", encoding="utf-8")
    with pytest.raises(DataError, match=rf"train.txt:2:2: expected an integer label after '\(', "
                                        rf"found '{re.escape(label)}' \(a label is written in "
                                        r"ASCII digits\)"):
        read_sst(path)


@pytest.mark.parametrize("line, token", [("a|DT b|\n", "b|"), ("a|DT b\n", "b"),
                                         ("|NN\n", "|NN")])
def test_a_tagged_token_needs_a_word_and_a_tag(tmp_path, line, token):
    path = tmp_path / "tags.txt"
    path.write_text("the|DT cat|NN\n" + line)
    with pytest.raises(DataError, match=rf"tags.txt:2: the token {re.escape(repr(token))} is "
                                        r"not word\|TAG"):
        _tagged(path)
    path.write_text("the|DT a|b|NN\n")  # the tag follows the last '|'
    assert _tagged(path) == [[("the", "DT"), ("a|b", "NN")]]


def test_load_sst_says_a_folder_that_does_not_exist_does_not_exist(tmp_path):
    with pytest.raises(DataError, match=r"nowhere: does not exist"):
        load_sst(tmp_path / "nowhere")
    write(tmp_path / "train.txt", SST_LINES)
    with pytest.raises(DataError, match=r"train.txt: is a file, not a directory"):
        load_sst(tmp_path / "train.txt")


@pytest.mark.parametrize("text, message", [
    ("", r"vectors.txt: holds no word vectors \(an empty file\)"),
    ("a 0.5 nan\n", r"vectors.txt:1: the vector of 'a' holds 'nan'; word vectors must be finite"),
    ("b 1 2\na -inf 2\n", r"vectors.txt:2: the vector of 'a' holds '-inf'"),
])
def test_word_vectors_that_are_empty_or_not_finite_are_refused(tmp_path, text, message):
    path = tmp_path / "vectors.txt"
    path.write_text(text)
    with pytest.raises(DataError, match=message):
        _vectors(path)


def test_the_binary_tasks_refuse_a_split_left_without_trees(sst_dir):
    from minicavs.data import sst_task

    write(sst_dir / "dev.txt", ["(2 (2 a) (2 b))", "(2 neutral)"])
    splits = load_sst(sst_dir)
    assert len(sst_task(splits, "fine").dev) == 2
    for task in ("binary", "binary3"):
        with pytest.raises(DataError, match=rf"--task {task}: all 2 dev trees have a neutral "
                                            rf"\(or unlabelled\) root, and the {task} task drops "
                                            r"those: no dev tree is left"):
            sst_task(splits, task)


# -- Tree validation -------------------------------------------------------------------------

@pytest.mark.parametrize("children, expected", [
    ([], "at least one vertex"),
    ([[1], []], "children must be numbered before their parent"),
    ([[], [0], [0, 1]], "vertex 0 has two parents"),
    ([[], [], [1]], "vertex 0 has no parent but is not the root"),
])
def test_tree_rejects_what_is_not_a_tree_in_child_first_order(children, expected):
    n = len(children)
    with pytest.raises(DataError, match=expected):
        Tree(children, np.full(n, -1), np.full(n, -1))


def test_tree_checks_array_lengths_and_tokens():
    with pytest.raises(DataError, match=r"words must have shape \(3,\)"):
        Tree([[], [], [0, 1]], [1, 2], [0, 0, 0])
    with pytest.raises(DataError, match="2 leaves but 3 tokens"):
        Tree([[], [], [0, 1]], [1, 2, -1], [0, 0, 0], ["a", "b", "c"])


def test_to_string_uses_a_vocabulary_when_there_are_no_tokens():
    vocab = Vocabulary(["a", "b"])
    tree = Tree([[], [], [0, 1]], [1, 2, -1], [-1, -1, -1])
    assert tree.to_string(vocab) == "(-1 (-1 a) (-1 b))"
    assert tree.to_string() == "(-1 (-1 1) (-1 2))"
    assert parse_tree(tree.to_string()).labels.tolist() == [-1, -1, -1]


# -- Vocabulary ------------------------------------------------------------------------------

def test_vocabulary_unknowns_map_to_zero():
    vocab = Vocabulary.build([["b", "a", "b"], ["c", "b", "a"]], min_count=2)
    assert vocab.tokens == ["<unk>", "b", "a"] and len(vocab) == 3
    assert vocab.lookup("c") == 0 and vocab.lookup("zzz") == 0 and vocab.lookup("<unk>") == 0
    assert vocab.encode(["a", "q", "b"]).tolist() == [2, 0, 1]
    assert vocab.decode([2, 0]) == ["a", "<unk>"]
    with pytest.raises(DataError, match="word id 3 is outside this vocabulary's range 0..2"):
        vocab.token(3)


def test_vocabulary_specials_come_first_and_lowercasing_travels_with_it(tmp_path):
    vocab = Vocabulary.build([["B", "b", "a"]], specials=["<eos>"], lowercase=True)
    assert vocab.tokens == ["<unk>", "<eos>", "b", "a"]
    assert vocab.lookup("A") == 3
    vocab.save(tmp_path / "v.json")
    loaded = Vocabulary.load(tmp_path / "v.json")
    assert loaded == vocab and loaded.lookup("B") == 2


def test_vocabulary_loads_a_plain_list_and_rejects_bad_files(tmp_path):
    (tmp_path / "v.txt").write_text("<unk>\nthe\n-LRB-\n", encoding="utf-8")
    assert Vocabulary.load(tmp_path / "v.txt").tokens == ["<unk>", "the", "-LRB-"]
    (tmp_path / "bad.txt").write_text("the\n<unk>\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"the first token must be '<unk>' \(id 0\), found 'the'"):
        Vocabulary.load(tmp_path / "bad.txt")
    (tmp_path / "dup.txt").write_text("<unk>\na\nb\na\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"token 'a' \(entry 3\) appears twice"):
        Vocabulary.load(tmp_path / "dup.txt")
    (tmp_path / "bad.json").write_text('{"words": []}', encoding="utf-8")
    with pytest.raises(DataError, match="not a vocabulary file"):
        Vocabulary.load(tmp_path / "bad.json")


# -- PTB -------------------------------------------------------------------------------------

PTB_LINES = [" the cat sat on the mat ", " a <unk> dog sat ", " N cats "]


def test_read_ptb_appends_eos(tmp_path):
    path = write(tmp_path / "ptb.valid.txt", PTB_LINES)
    sentences = read_ptb(path)
    assert sentences[1] == ["a", "<unk>", "dog", "sat", "<eos>"] and len(sentences) == 3


def test_load_ptb_uses_eos_as_id_one_and_keeps_unk_as_zero(tmp_path):
    write(tmp_path / "ptb.valid.txt", PTB_LINES)
    write(tmp_path / "ptb.test.txt", [" the dog "])
    corpus = load_ptb(tmp_path)
    assert corpus.train is None and len(corpus.valid) == 3 and len(corpus.test) == 1
    vocab = corpus.vocab
    assert vocab.lookup("<eos>") == 1 and vocab.lookup("<unk>") == 0
    assert vocab.decode(corpus.valid[1]) == ["a", "<unk>", "dog", "sat", "<eos>"]
    assert corpus.test[0].dtype == np.int64 and corpus.test[0][-1] == 1
    with pytest.raises(DataError, match="no PTB file found"):
        load_ptb(tmp_path / "nowhere")


def test_batch_sentences_and_pad_batch():
    sentences = [np.arange(n) for n in (5, 1, 3, 2, 4)]
    plain = batch_sentences(sentences, 2)
    assert [[len(s) for s in b] for b in plain] == [[5, 1], [3, 2], [4]]
    assert len(batch_sentences(sentences, 2, drop_last=True)) == 2
    by_length = batch_sentences(sentences, 2, by_length=True)
    assert [[len(s) for s in b] for b in by_length] == [[1, 2], [3, 4], [5]]
    shuffled = batch_sentences(sentences, 2, rng=0, by_length=True)
    assert sorted(tuple(len(s) for s in b) for b in shuffled) == [(1, 2), (3, 4), (5,)]
    assert [[len(s) for s in b] for b in batch_sentences(sentences, 2, rng=0)] == \
        [[len(s) for s in b] for b in batch_sentences(sentences, 2, rng=0)]
    ids, lengths = pad_batch([np.array([4, 5, 6]), np.array([7])], pad_id=-1)
    assert ids.tolist() == [[4, 5, 6], [7, -1, -1]] and lengths.tolist() == [3, 1]
    with pytest.raises(DataError, match="batch_size must be at least 1"):
        batch_sentences(sentences, 0)


# -- metrics ---------------------------------------------------------------------------------

def test_fine_grained_and_binary_accuracy():
    gold = np.array([0, 1, 2, 3, 4, 4])
    predicted = np.array([0, 0, 2, 4, 2, 3])
    assert fine_grained_accuracy(predicted, gold) == pytest.approx(2 / 6)
    # neutral gold dropped; 0,1 -> negative and 3,4 -> positive; a neutral prediction is wrong
    assert binary_accuracy(predicted, gold) == pytest.approx(4 / 5)
    assert binary_accuracy([0, 1, 1, 1, 0, 1], gold, predicted_classes=2) == pytest.approx(3 / 5)
    assert to_binary([0, 1, 2, 3, 4]).tolist() == [0, 0, -1, 1, 1]
    assert np.isnan(binary_accuracy([2], [2]))


def test_metrics_reject_mismatched_or_out_of_range_labels():
    with pytest.raises(ShapeError, match="predicted has 2 labels but gold has 3"):
        fine_grained_accuracy([0, 1], [0, 1, 2])
    with pytest.raises(IndexRangeError, match="gold holds label 5; labels here lie in 0..4"):
        fine_grained_accuracy([0], [5])
    with pytest.raises(IndexRangeError, match="predicted holds label 3"):
        binary_accuracy([3], [4], predicted_classes=2)


# -- the real SST, where it is available -----------------------------------------------------

# The project's shared data sits beside the checkout (../shared/data), where it exists.
SST_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "sst"


@pytest.mark.skipif(not (SST_DIR / "train.txt").is_file(),
                    reason=f"the real SST is not in {SST_DIR}; the fixtures above cover parsing")
def test_real_sst_train_parses_and_prints_back():
    trees = read_sst(SST_DIR / "train.txt")
    assert len(trees) == 8544
    assert all(max(len(kids) for kids in t.children) <= 2 for t in trees)  # SST is binary
    with open(SST_DIR / "train.txt", encoding="utf-8") as f:
        first = f.readline().rstrip("\n")
    assert trees[0].to_string() == first


@pytest.mark.parametrize("was_on", [True, False])
def test_the_collector_is_paused_while_trees_are_made_and_left_as_it_was(was_on):
    import gc

    from minicavs.data.files import collector_paused

    (gc.enable if was_on else gc.disable)()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert gc.isenabled() == was_on
        with pytest.raises(ZeroDivisionError):  # (a reader's error: the collector back too)
            with collector_paused():
                1 / 0
        assert gc.isenabled() == was_on
    finally:
        gc.enable()
