"""Chapter 12: predict F.explain()["forward_backend"] ("native" or "interpreter") for these
two cells on this machine (a compiler installed, MINICAVS_NATIVE unset):

    def plain(v):
        v.scatter(mc.tanh(v.pull() + v.gather(0) @ U))
    def with_softmax(v):
        v.scatter(mc.tanh(v.pull() + mc.softmax(v.gather(0) @ U)))

Check: python -m minicavs.exercises check native"""

PREDICTION = {"plain": None, "with_softmax": None}
