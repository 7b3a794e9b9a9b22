"""Chapter 4: predict, for this function traced on a (2, 3) float64 input,

    W = mc.Parameter(np.ones((3, 3)))
    def f(x):
        return mc.exp(x @ W) * mc.sigmoid(x @ W) + mc.tanh(x)

the number of op nodes of the trace, after merge_common_subexpressions, the number of fused
groups fusion_groups finds in the merged graph, and the size of the largest.
Check: python -m minicavs.exercises check symbolic"""

PREDICTION = {"ops": None, "ops_after_cse": None, "fused_groups": None, "largest_group": None}
