from minicavs.cpu import unavailable

PREDICTION = {"plain": "native" if unavailable() is None else "interpreter",
              "with_softmax": "interpreter"}
