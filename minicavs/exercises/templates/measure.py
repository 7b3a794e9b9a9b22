"""Chapter 16: the two functions a reported figure rests on.

best_epoch(history, metric): history is a list of (stats, dev_metrics) per epoch, as
minicavs.training.fit returns it; dev_metrics is a dict such as {"loss": 0.6, "fine": 0.41}.
Return the epoch (counted from 1) of the highest dev score of `metric` — the earliest of
equals — skipping epochs whose score is missing or NaN; None if no epoch has one.

standard_error(accuracy, n): the standard error of an accuracy measured on n independent
sentences (a binomial proportion), as a fraction (0.015 for 1.5 points).

Check: python -m minicavs.exercises check measure"""


def best_epoch(history, metric):
    return len(history)          # the last epoch: what a protocol that selects on dev does not do


def standard_error(accuracy, n):
    return 0.0
