import minicavs as mc


@mc.recursive(scatter_shape=(1,), pull_shape=(1,))
def height(node):
    if node.is_leaf:
        return node.pull()
    states = [height(child) for child in node.children]
    highest = states[0]
    for s in states[1:]:
        highest = mc.maximum(highest, s)
    return highest + 1.0
