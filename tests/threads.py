"""Running test code from several threads at once: every thread's failure is reported."""

import threading


def run_in_threads(work, count):
    """``work(k)`` for k < ``count``, each on its own thread, all started before any is
    joined; raises the first failure."""
    errors = []

    def run(k):
        try:
            work(k)
        except BaseException as exc:  # noqa: BLE001 (raised below, in the test's thread)
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
