PREDICTION = {"with": [1, 6, 6], "without": [8, 13, 13]}
