import math


def best_epoch(history, metric):
    best = None
    for epoch, (_, metrics) in enumerate(history, start=1):
        score = metrics.get(metric, float("nan"))
        if math.isfinite(score) and (best is None or score > best[0]):
            best = (score, epoch)
    return best[1] if best else None


def standard_error(accuracy, n):
    return math.sqrt(accuracy * (1 - accuracy) / n)
