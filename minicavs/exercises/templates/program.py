"""Chapter 7: predict the instruction counts (eager, core, lazy) of F.program and
F.backward_program for this cell (all passes on):

    def cell(v):                                   # W: (3, 4), U: (8, 4), W_out: (4, 2)
        h = mc.sigmoid(v.pull() @ W + mc.concat([v.gather(0), v.gather(1)]) @ U)
        v.scatter(h)
        v.push(h @ W_out)

Check: python -m minicavs.exercises check program"""

PREDICTION = {"F": None, "dF": None}     # e.g. "F": [eager, core, lazy]
