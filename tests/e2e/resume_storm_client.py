"""One client resuming one run many times at once, in a process of its own (as a real client is).

    python resume_storm_client.py <ingress url> <run id> <token> <resumes>

Prints `launched` once every resume is under way, then, once each is served (its first frame
read) or refused, one JSON line: `{"served": [first frame, ...], "refused": [body, ...],
"other": [status, ...]}`. Served resumes stay open until stdin closes.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import httpx


async def resume(
    http: httpx.AsyncClient, path: str, token: str, done: asyncio.Event, out: dict[str, list[Any]]
) -> None:
    headers = {"Authorization": f"Bearer {token}", "Last-Event-ID": "0"}
    async with http.stream("GET", path, headers=headers) as response:
        if response.status_code == 429:
            out["refused"].append(json.loads(await response.aread()))
            return
        if response.status_code != 200:
            out["other"].append(response.status_code)
            return
        body = response.aiter_bytes()
        out["served"].append((await anext(body)).decode())
        await done.wait()


async def main(url: str, run_id: str, token: str, count: int) -> None:
    out: dict[str, list[Any]] = {"served": [], "refused": [], "other": []}
    done = asyncio.Event()
    limits = httpx.Limits(max_connections=count + 10, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as http:
        path = f"/atmosphere/runs/{run_id}/events"

        async def one() -> None:
            try:
                await resume(http, path, token, done, out)
            except httpx.HTTPError as exc:
                out["other"].append(type(exc).__name__)

        tasks = [asyncio.create_task(one()) for _ in range(count)]
        print("launched", flush=True)
        while sum(len(v) for v in out.values()) < count and not all(t.done() for t in tasks):
            await asyncio.sleep(0.05)
        print(json.dumps(out), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        done.set()
        await asyncio.gather(*tasks, return_exceptions=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
