import minicavs as mc


def softsign(x):
    return x / (1 + mc.abs(x))
