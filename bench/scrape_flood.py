"""Scrapers without end: CONNECTIONS clients each GETting /metrics again as soon as answered.

Usage: python -m bench.scrape_flood PORT [CONNECTIONS]. Runs until killed; its own process, so
its work does not share the timing process's event loop. (bench/opsflood.py starts it.)
"""

from __future__ import annotations

import asyncio
import sys

REQUEST = b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


async def scrape_forever(port: int) -> None:
    while True:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(REQUEST)
            await reader.read()  # to the end: the server closes after one answer
            writer.close()
        except OSError:
            await asyncio.sleep(0.01)


async def main(port: int, connections: int) -> None:
    await asyncio.gather(*(scrape_forever(port) for _ in range(connections)))


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 500))
