#!/usr/bin/env python3
"""SSE load on `huddle serve` (plan 0048): CLIENTS event streams on one room while a
writer posts RATE messages a minute for DURATION seconds.

Reports the server's CPU (user + system, from /proc) and peak RSS, the delivery delay
of each row to each client (from just before its `huddle post` started to its arrival
on the stream), and checks that every client received every row of the room exactly
once, in ledger order (against `huddle tail --json`).

    scripts/bench-serve.py [DB]          default: a fresh SQLite file
    CLIENTS=50 RATE=1000 DURATION=60 HUDDLE=target/release/huddle scripts/bench-serve.py
    FRAGMENTS=0 ...                      event streams only (no fragment fetches)

The writer is one `huddle post` process per message, on the same machine: its cost is
the machine's, not the server's, and is not counted in the server's CPU.
"""

import http.client
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

HUDDLE = os.environ.get("HUDDLE", "target/release/huddle")
CLIENTS = int(os.environ.get("CLIENTS", "50"))
RATE = int(os.environ.get("RATE", "1000"))
DURATION = float(os.environ.get("DURATION", "60"))
FRAGMENTS = os.environ.get("FRAGMENTS", "1") != "0"
ROOM = "bench"
stopping = threading.Event()


def huddle(db, *args, check=True):
    env = dict(os.environ, HUDDLE_DB=db, HUDDLE_LOG="warn", HUDDLE_KEYS=keys)
    return subprocess.run([HUDDLE, *args], env=env, check=check, capture_output=True, text=True)


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def peak_rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


class Client(threading.Thread):
    """One browser's worth: the room's event stream and, like the page script, a
    fetch of the room's live fragment 200 ms after events arrive (one at a time)."""

    def __init__(self, port):
        super().__init__(daemon=True)
        self.port = port
        self.ids = []
        self.delays = []
        self.connected = threading.Event()
        self.changed = threading.Event()
        self.fetches = 0
        self.failed_fetches = 0
        threading.Thread(target=self.refresher, daemon=True).start()

    def refresher(self):
        while not stopping.is_set():
            self.changed.wait()
            time.sleep(0.2)
            self.changed.clear()
            if stopping.is_set():
                return
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
            conn.request("GET", f"/rooms/{ROOM}/live")
            resp = conn.getresponse()
            resp.read()
            if resp.status != 200:
                self.failed_fetches += 1
            self.fetches += 1

    def run(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        conn.request("GET", f"/api/rooms/{ROOM}/events?after=0:0",
                     headers={"Accept": "text/event-stream"})
        resp = conn.getresponse()
        assert resp.status == 200, resp.status
        self.connected.set()
        event, ident, data = "message", "", []
        while True:
            line = resp.readline()
            if not line:
                return
            line = line.decode().rstrip("\r\n")
            if line == "":
                if data and event == "interaction":
                    self.ids.append(ident)
                    if FRAGMENTS:
                        self.changed.set()
                    row = json.loads("\n".join(data))
                    text = (row.get("body") or {}).get("text") or ""
                    if text.startswith("bench "):
                        sent = float(text.split("t=")[1])
                        self.delays.append(time.time() - sent)
                event, ident, data = "message", "", []
            elif line.startswith(":"):
                continue
            else:
                k, _, v = line.partition(":")
                v = v[1:] if v.startswith(" ") else v
                if k == "event":
                    event = v
                elif k == "id":
                    ident = v
                elif k == "data":
                    data.append(v)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


tmp = tempfile.mkdtemp(prefix="huddle-bench-serve-")
keys = os.path.join(tmp, "keys")
db = sys.argv[1] if len(sys.argv) > 1 else f"sqlite://{tmp}/bench.db"
huddle(db, "room", "create", ROOM, "--owner", "ana")
server = subprocess.Popen([HUDDLE, "serve", "--addr", "127.0.0.1:0"],
                          env=dict(os.environ, HUDDLE_DB=db, HUDDLE_LOG="warn"),
                          stdout=subprocess.PIPE, text=True)
url = server.stdout.readline().strip()
port = int(url.rsplit(":", 1)[1].strip("/"))
clients = [Client(port) for _ in range(CLIENTS)]
for c in clients:
    c.start()
for c in clients:
    assert c.connected.wait(30), "a client did not connect"
cpu0, t0 = cpu_seconds(server.pid), time.time()
interval = 60.0 / RATE
n = 0
while time.time() - t0 < DURATION:
    due = t0 + n * interval
    if time.time() < due:
        time.sleep(due - time.time())
    huddle(db, "post", "--room", ROOM, "--as", f"w{n % 10}", f"bench {n} t={time.time():.6f}")
    n += 1
elapsed = time.time() - t0
rows = [json.loads(l) for l in huddle(db, "tail", "--room", ROOM, "--json").stdout.splitlines()]
expected = [f"{r['position']['major']}:{r['position']['minor']}" for r in rows]
deadline = time.time() + 30
while time.time() < deadline and any(len(c.ids) < len(expected) for c in clients):
    time.sleep(0.1)
cpu = cpu_seconds(server.pid) - cpu0
rss = peak_rss_mib(server.pid)
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
conn.request("GET", "/metrics")
metrics = conn.getresponse().read().decode()
renders = next((l.split()[1] for l in metrics.splitlines()
                if l.startswith("huddle_fragment_renders_total ")), "?")
stopping.set()
for c in clients:
    c.changed.set()
time.sleep(0.5)
server.terminate()
server.wait(10)
exact = sum(1 for c in clients if c.ids == expected)
delays = [d for c in clients for d in c.delays]
print(f"clients {CLIENTS}, messages {n} in {elapsed:.1f} s ({n / elapsed * 60:.0f}/min), "
      f"rows in the room {len(expected)}")
print(f"server CPU {cpu:.2f} s over {elapsed:.1f} s = {100 * cpu / elapsed:.1f}% of one core; "
      f"peak RSS {rss:.1f} MiB")
print(f"delivery delay (post start to arrival) p50 {1000 * pct(delays, 50):.0f} ms, "
      f"p99 {1000 * pct(delays, 99):.0f} ms, max {1000 * max(delays, default=0):.0f} ms "
      f"({len(delays)} deliveries)")
failed = sum(c.failed_fetches for c in clients)
print(f"clients with every row once, in ledger order: {exact}/{CLIENTS}; "
      f"live-fragment fetches {sum(c.fetches for c in clients)} ({failed} failed, "
      f"{renders} rendered)")
sys.exit(0 if exact == CLIENTS and failed == 0 else 1)
