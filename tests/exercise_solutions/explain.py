PREDICTION = {"levels": 4, "vertices_per_level": [6, 4, 3, 1]}
