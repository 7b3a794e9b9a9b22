"""Chapter 15: predict F.explain()["levels"] and ["vertices_per_level"] after one call of a
vertex function on this batch:

    mc.GraphBatch([mc.InputGraph.chain(4), mc.InputGraph.complete_binary(4),
                   mc.InputGraph(children=[[], [0], [0, 1]])])

Check: python -m minicavs.exercises check explain"""

PREDICTION = {"levels": None, "vertices_per_level": None}
