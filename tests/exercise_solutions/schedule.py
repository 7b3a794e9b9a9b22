def levels(children):
    level = [None] * len(children)

    def of(v):
        if level[v] is None:
            level[v] = 1 + max(of(c) for c in children[v]) if children[v] else 0
        return level[v]

    return [of(v) for v in range(len(children))]
