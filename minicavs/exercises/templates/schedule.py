"""Chapter 6: the level of every vertex of one graph: 0 for a vertex without children, else 1 +
the highest level of its children. ``children[v]`` lists v's children (a tree or a DAG).
Check: python -m minicavs.exercises check schedule"""


def levels(children):
    return [0] * len(children)
