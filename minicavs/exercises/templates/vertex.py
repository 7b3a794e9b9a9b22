"""Chapter 5: a cell whose scattered state (shape (1,)) is the number of vertices in the subtree
below the vertex (a leaf: 1). The checker runs mc.VertexFunction(cell, scatter_shape=(1,),
arity=2, dtype="float64") on random binary trees. Check: python -m minicavs.exercises check vertex"""
import minicavs as mc


def cell(v):
    v.scatter(v.gather(0) + v.gather(1))
