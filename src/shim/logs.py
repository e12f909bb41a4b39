"""devshim's log: human-readable text by default, or JSON lines for a log collector.

Fields bound with ``logger.contextualize`` or ``logger.bind`` (resource, driver) are on every
line they apply to: the composition root binds them where each resource's and driver's tasks are
created, and tasks inherit them. The kubelet API version of the RPC being served (version) comes
from ``API_VERSION``, set on every call by shim/ops/rpc.py.
"""

from __future__ import annotations

import json
import sys
from contextvars import ContextVar
from typing import Any, Literal, TextIO

from loguru import logger

Format = Literal["text", "json"]
_FIELDS = ("resource", "version", "driver")

# Set per RPC: far cheaper on the Allocate path than logger.contextualize (a lock and a dict copy
# on the way in and out), and only read when a line is written.
API_VERSION: ContextVar[str | None] = ContextVar("api_version", default=None)


def _add_version(record: Any) -> None:
    version = API_VERSION.get()
    if version is not None:
        record["extra"].setdefault("version", version)


logger.configure(patcher=_add_version)


def setup(level: str, fmt: Format = "text", stream: TextIO | None = None) -> None:
    """Send every record at `level` or above to `stream` (stderr) in the chosen format."""
    out = stream or sys.stderr
    logger.remove()
    if fmt == "json":
        logger.add(lambda message: _write_json(out, message.record), level=level, format="{message}")
    else:
        logger.add(out, level=level, format=_text_format)


def _text_format(record: Any) -> str:
    extra = record["extra"]
    fields = "".join(f"{key}={{extra[{key}]}} " for key in _FIELDS if key in extra)
    context = f"{fields.rstrip()} | " if fields else ""
    return "{time:YYYY-MM-DD HH:mm:ss.SSS} | {level: <7} | " + context + "{message}\n{exception}"


def _write_json(out: TextIO, record: Any) -> None:
    line: dict[str, Any] = {
        "time": record["time"].isoformat(),
        "level": record["level"].name,
        "message": record["message"],
        **{key: str(value) for key, value in record["extra"].items()},
        "source": f"{record['name']}:{record['line']}",
    }
    if record["exception"] is not None:
        kind, value, _ = record["exception"]
        line["exception"] = f"{kind.__name__ if kind else 'Exception'}: {value}"
    out.write(json.dumps(line) + "\n")
    out.flush()
