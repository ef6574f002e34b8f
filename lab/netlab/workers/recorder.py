"""Record every skewd message of a lab run to JSONL, as a subscriber on the cluster sees it.

    recorder.py --url nats://10.79.0.3:4222 --out RUN/messages.jsonl --ready RUN/recorder.ready

One core-NATS subscription on ``skewd.v1.>`` (findings, incidents and remaps are JetStream
subjects, but a plain subscriber receives their publications too, in order): each line is
``{"recv": <wall s>, "subject": ..., "msg": <the payload as JSON>}``. Nothing is decoded here:
scoring decodes with the product's own strict decoders (``skewd.wire``,
``skewd.controller.messages``), so a malformed message is an error there, not a silent gap.
``--ready`` is written once the subscription is live on the server: start agents after it.
Runs inside the control namespace with the lab's Python (nats-py); stops on SIGTERM.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time


async def run(a: argparse.Namespace) -> None:
    import nats

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for s in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(s, stop.set)
    out = open(a.out, "a", buffering=1)
    count = 0

    async def on_msg(m) -> None:
        nonlocal count
        try:
            body = json.loads(m.data)
        except ValueError:
            body = {"undecodable": m.data.decode("utf-8", "replace")}
        out.write(json.dumps({"recv": time.time(), "subject": m.subject, "msg": body}, separators=(",", ":")) + "\n")
        count += 1

    deadline = time.monotonic() + 60
    while True:
        try:
            nc = await nats.connect(a.url, max_reconnect_attempts=-1, reconnect_time_wait=0.5,
                                    connect_timeout=2)
            break
        except Exception:  # noqa: BLE001 - the server may still be starting
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.3)
    await nc.subscribe("skewd.v1.>", cb=on_msg)
    await nc.flush()
    with open(a.ready, "w") as f:
        f.write(str(time.time()))
    await stop.wait()
    await nc.drain()
    out.close()
    print(json.dumps({"recorded": count}), flush=True)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--ready", required=True)
    asyncio.run(run(p.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
