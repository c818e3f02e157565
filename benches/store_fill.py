#!/usr/bin/env python3
"""Fills a running handoff with CONVERSATIONS conversations of TURNS requests each,
spread over TENANTS callers (one bearer key each), through its real chat endpoint:
every request re-sends its whole history, as a client does: the caller's system prompt
(8 KB, one per tenant, as an agent's), then user turns of 300 to 900 bytes of varied
text, each followed by the upstream's reply echoed back.

usage: store_fill.py PORT CONVERSATIONS TURNS TENANTS [WORKERS]
Prints one JSON line: requests sent, seconds, requests per second, failures.
"""

import http.client
import json
import multiprocessing
import random
import sys
import time

WORDS = ("the build failed in module parser because the token stream ended early "
         "fix the tests then rerun cargo check and report which files changed "
         "config loader reads toml and env with figment retention prune erase hold "
         "compact summary ledger facts tool call result output error warning ok").split()


def user_turn(rng, conversation, turn):
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(50, 150)))
    return json.dumps({"role": "user", "content": f"c{conversation} t{turn}: {words}"})


def system_prompt(tenant):
    rules = " ".join(f"Rule {n}: keep the change small and test it ({tenant})." for n in range(150))
    return json.dumps({"role": "system", "content": f"You are tenant {tenant}'s coding agent. {rules}"})


def worker(args):
    port, first, count, turns, tenants, index = args
    rng = random.Random(index)
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    sent = failures = 0
    for conversation in range(first, first + count):
        key = f"Bearer sk-scale-tenant-{conversation % tenants:03}"
        headers = {
            "content-type": "application/json",
            "authorization": key,
            "x-handoff-conversation-id": f"s{conversation}",
        }
        history = [system_prompt(conversation % tenants)]
        for turn in range(turns):
            history.append(user_turn(rng, conversation, turn))
            body = '{"model":"bench-model","messages":[' + ",".join(history) + "]}"
            for attempt in range(3):
                try:
                    connection.request("POST", "/v1/chat/completions", body, headers)
                    response = connection.getresponse()
                    data = response.read()
                    break
                except (OSError, http.client.HTTPException):
                    connection.close()
                    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                    data = b""
                    response = None
            sent += 1
            if response is None or response.status != 200:
                failures += 1
                history.append(json.dumps({"role": "assistant", "content": "(failed)"}))
                continue
            reply = json.loads(data)["choices"][0]["message"]
            history.append(json.dumps(reply))
    return sent, failures


def main():
    port, conversations, turns, tenants = (int(a) for a in sys.argv[1:5])
    workers = int(sys.argv[5]) if len(sys.argv) > 5 else 4
    share = -(-conversations // workers)
    jobs = [(port, w * share, max(0, min(share, conversations - w * share)), turns, tenants, w)
            for w in range(workers)]
    started = time.time()
    with multiprocessing.Pool(workers) as pool:
        results = pool.map(worker, jobs)
    seconds = time.time() - started
    sent = sum(r[0] for r in results)
    print(json.dumps({"requests": sent, "seconds": round(seconds, 1),
                      "per_second": round(sent / seconds), "failures": sum(r[1] for r in results)}))


if __name__ == "__main__":
    main()
