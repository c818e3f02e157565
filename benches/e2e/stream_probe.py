"""Streams N chat completions (or Anthropic messages, or Responses) from URL and reports time to first
byte and the gaps between SSE events, measured on the raw socket as bytes arrive. TTFB also
counts EXTRA more requests (30 unless PROBE_EXTRA says) that hang up at their first event:
a median of a few streams is mostly noise.
Usage: stream_probe.py HOST PORT N [anthropic|responses]   -> JSON on stdout."""
import os
import json
import socket
import statistics
import sys
import time

host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
api = sys.argv[4] if len(sys.argv) > 4 else "chat"
anthropic = api == "anthropic"
request = {"model": "bench-model", "stream": True, "messages": [{"role": "user", "content": "stream please"}]}
if anthropic:
    request["max_tokens"] = 256
if api == "responses":
    request = {"model": "bench-model", "stream": True, "store": False, "input": "stream please"}
body = json.dumps(request, separators=(",", ":")).encode()
path = {"anthropic": "/v1/messages", "responses": "/v1/responses"}.get(api, "/v1/chat/completions")
head = (
    f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
    f"Authorization: Bearer sk-bench\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
).encode()
ttfbs, gaps = [], []
extra = int(os.environ.get("PROBE_EXTRA", "30"))
for index in range(n + extra):
    sock = socket.create_connection((host, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    start = time.perf_counter()
    sock.sendall(head + body)
    buffer, events, first, seen_headers = b"", [], None, False
    while True:
        chunk = sock.recv(65536)
        now = time.perf_counter()
        if not chunk:
            break
        buffer += chunk
        if not seen_headers and b"\r\n\r\n" in buffer:
            seen_headers = True
            buffer = buffer.split(b"\r\n\r\n", 1)[1]
        if seen_headers and first is None and b"data:" in buffer:
            first = now - start
            if index >= n:
                break
        count = buffer.count(b"\n\n")
        events += [now] * count
        buffer = buffer.rsplit(b"\n\n", 1)[-1] if count else buffer
    sock.close()
    ttfbs.append(first or 0.0)
    if index < n:
        gaps += [b - a for a, b in zip(events, events[1:])]
ms = lambda xs: round(1000 * xs, 2)
print(json.dumps({
    "ttfb_p50_ms": ms(statistics.median(ttfbs)),
    "gap_p50_ms": ms(statistics.median(gaps)) if gaps else None,
    "gap_max_ms": ms(max(gaps)) if gaps else None,
    "events_per_stream": len(gaps) / n + 1,
}))
