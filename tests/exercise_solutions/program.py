PREDICTION = {"F": [1, 5, 1], "dF": [8, 6, 3]}
