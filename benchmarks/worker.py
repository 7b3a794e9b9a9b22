"""The subprocess that runs one system on one workload (see common.worker_main)."""

from benchmarks.common import worker_main

if __name__ == "__main__":
    worker_main()
