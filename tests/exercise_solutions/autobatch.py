import minicavs as mc


def rule(op, items, attrs, out):
    (x, domain), = items
    return x / mc.sum(x, axis=-1, keepdims=True)
