"""The fault/soak suite: a real devshim process, real drivers and the fake kubelet, with faults
injected at random while invariants are checked (docs/reliability.md).

    python -m tests.soak --faults 1000 --seed 7 --json soak.json    # the long run
    python -m pytest tests/soak                                      # the short run CI makes
"""
