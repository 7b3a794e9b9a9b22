"""Chapter 8: predict F.explain()["backward_ops_per_level"] after a forward and backward of
this cell on 3 complete binary trees of 4 leaves, with lazy batching and without it
(options={"lazy_batching": False}):

    def cell(v):                                   # W: (3, 4), U: (8, 4), b: (4,), W_out: (4, 2)
        h = mc.sigmoid(v.pull() @ W + mc.concat([v.gather(0), v.gather(1)]) @ U + b)
        v.scatter(h)
        v.push(h @ W_out)

Check: python -m minicavs.exercises check lazy"""

PREDICTION = {"with": None, "without": None}     # lists, one count per level
