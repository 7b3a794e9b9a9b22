PREDICTION = {"ops": 7, "ops_after_cse": 6, "fused_groups": 1, "largest_group": 5}
