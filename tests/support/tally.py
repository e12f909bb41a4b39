"""Counting the steps a stateful search ran, by rule, for the figure a note reports.

``DEVSHIM_CONVERGE_TALLY=FILE`` names the file; it is rewritten after every step, so a run cut
short still counts what it did.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path


class Tally:
    def __init__(self, file: str | None = os.environ.get("DEVSHIM_CONVERGE_TALLY")) -> None:
        self.file = Path(file) if file else None
        self.counts: Counter[str] = Counter()

    def __call__(self, rule_name: str) -> None:
        self.counts[rule_name] += 1
        if self.file is not None:
            self.file.write_text(json.dumps({"steps": self.counts.total(), **self.counts}))
