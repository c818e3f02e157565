"""Sends one JSON body COUNT times over one keep-alive connection, each after the last
answer is read whole: the steady load benches/instructions.sh counts instructions under.
A body named *anthropic* goes to /v1/messages, *responses* to /v1/responses, any other to
/v1/chat/completions (the names benches/e2e/bodies.py writes).

    python3 benches/e2e/repeat.py HOST:PORT BODY.json COUNT [CONVERSATION]

With DISTINCT=1 in the environment, each request's body opens with a field of its own
(`"distinct": N`), so no two bodies share their leading bytes and no prefix memo is ever
found: what a memo costs when nothing repeats it.
"""
import os
import socket
import sys

address, path, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
conversation = sys.argv[4] if len(sys.argv) > 4 else ""
host, port = address.rsplit(":", 1)
body = open(path, "rb").read()
name = os.path.basename(path)
route = "/v1/messages" if "anthropic" in name else "/v1/responses" if "responses" in name else "/v1/chat/completions"
head = (
    # The listener's own address: handoff refuses a Host that is not one of its names.
    f"POST {route} HTTP/1.1\r\nHost: {address}\r\n"
    "Content-Type: application/json\r\nAuthorization: Bearer sk-bench\r\n"
    + (f"x-handoff-conversation-id: {conversation}\r\n" if conversation else "")
    + f"Content-Length: {len(body)}\r\n\r\n"
)
request = head.encode() + body
distinct = os.environ.get("DISTINCT") == "1"
connection = socket.create_connection((host, int(port)))
connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def answer():
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = connection.recv(65536)
        if not chunk:
            sys.exit("the proxy closed the connection")
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    lines = head.split(b"\r\n")
    if not lines[0].startswith(b"HTTP/1.1 200"):
        sys.exit(f"unexpected answer: {lines[0]!r}")
    length = next(int(line.split(b":", 1)[1]) for line in lines if line.lower().startswith(b"content-length:"))
    while len(rest) < length:
        rest += connection.recv(65536)


for n in range(count):
    if distinct:
        own = b'{"distinct": %d, ' % n + body.lstrip()[1:]
        connection.sendall(head.replace(f"Content-Length: {len(body)}", f"Content-Length: {len(own)}").encode() + own)
    else:
        connection.sendall(request)
    answer()
