"""Hostile-traffic benchmark: replay the attacks found against `python -m service` (no API key
needed for any of them) on 127.0.0.1 and measure what they do to an ordinary client beside them
and to the server's memory.

    python -m benchmarks.hostile_bench --bundle bundles/multi30k-en-de [--attacks abcd] \\
        [--duration 20] [--connections 3000] [--big-clients 8] [--settle-s 60] \\
        [--baseline-s 5] [--victim-timeout-s 30] [--flags "--header-timeout-s 10"] \\
        [--fresh-server] [--json OUT]

The attacks, each for `--duration` seconds:

  a  header trickle: one socket sends `GET /health HTTP/1.1`, a Host line and `X-Big: `, then
     256 KiB chunks of header bytes without a line end, as fast as the socket takes them, until
     the server closes it (when it did is reported) or the time is up.
  b  idle connections: `--connections` N sockets that send nothing, N/3 that send half a request
     header and N/3 that send whole headers with Content-Length: 100 and half the body, held
     open; reported: how many the server closed by itself, after how long, and what it answered.
     This process's RLIMIT_NOFILE soft limit is raised to its hard limit and N capped below it.
  c  bad input, one request at a time: lone surrogates (escaped `\\ud800` in the JSON, and raw
     invalid UTF-8) in a text and in a language code, LibreTranslate JSON nested 100,000 deep,
     control-character-only text, wrong types (`"beam_size": "8"` or `true`); statuses by case.
  d  work before limits: `--big-clients` clients each POST a ~1 MB text ("A. " x 346,000, just
     under the 1 MiB body limit) to /translate, again and again; statuses and time per answer.
     No new request starts after `--duration`; one in flight gets `--duration` more to finish.

Throughout, a victim (a separate process, so that the attacker's threads do not hold its
interpreter lock) alternates POST /translate with a short sentence at beam 1 and GET /health,
one request at a time on a new connection each (an attack may break new connections and spare
a kept-alive one), `--baseline-s` seconds before the attack, during it, and `--settle-s` seconds
after it. Reported per attack: the victim's p50/p99 of answered (2xx) requests in each phase,
its non-2xx answers, its 5xx, and its lost requests (no answer: a connection error or no answer
within `--victim-timeout-s`); the server's RSS (/proc/<pid>/status VmRSS) at the attack's start,
its peak during it, right after and after `--settle-s`; the server's CPU use and open file
descriptors during the attack. The goals (printed, never enforced): the victim's p50 during an
attack at most 2x its p50 before, the settled RSS within 10 % of the RSS before; nothing lost, no
5xx to the victim and none but 503 (the server shedding connections) to the attacker (exit
status 1 otherwise).

One server serves all the attacks (`--fresh-server`: a new one for each), so an attack's "before"
is the previous one's aftermath; a server that died is started again for the next attack. On a
two-core machine the server, the victim and the attacker share the cores: the figures measure the
server under attack plus that competition, and the attacker (one Python process) cannot reach the
rates a real attacker with more machines would. Everything stays on 127.0.0.1, and every loop is
bounded in time and count.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import random
import resource
import selectors
import shlex
import socket
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.queues import Queue
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import httpx

from benchmarks.servers import DEFAULT_TEXTS, HOST, Running, percentile_ms, service

ATTACKS = {
    "a": "header trickle",
    "b": "idle connections",
    "c": "bad input",
    "d": "work before limits",
}
# The victim's phases (shared with its process as a number).
WARMUP, BASELINE, DURING, AFTER = 0, 1, 2, 3
PHASES = {BASELINE: "baseline", DURING: "during", AFTER: "after"}
VICTIM_PAUSE_S = 0.02  # between the victim's requests: a client, not a second load generator
VICTIM_MAX_REQUESTS = 100_000
TRICKLE_CHUNK = 256 * 1024
FD_MARGIN = 256  # descriptors kept free in this process beside attack b's sockets
BAD_INPUT_MAX_ROUNDS = 5_000
BIG_CLIENT_MAX_REQUESTS = 100_000
BIG_TEXT = "A. " * 346_000  # 1,038,000 characters: with the JSON around it, under 1 MiB
NESTING = 100_000
RATIO_GOAL = 2.0
RSS_DRIFT_GOAL_PCT = 10.0


@dataclass(frozen=True)
class Options:
    duration: float = 20.0
    connections: int = 3000
    big_clients: int = 8
    settle_s: float = 60.0
    baseline_s: float = 5.0
    victim_timeout_s: float = 30.0
    victim_beam_size: int = 1


@dataclass
class PhaseStats:
    requests: int
    answered: int  # 2xx
    p50_ms: float
    p99_ms: float
    outcomes: dict[str, int]  # status code or exception name -> count


@dataclass
class AttackResult:
    attack: str
    name: str
    seconds: float = 0.0
    victim: dict[str, dict[str, PhaseStats]] = field(default_factory=dict)  # phase -> kind
    victim_5xx: int = 0
    victim_errors: int = 0  # answers that are neither 2xx nor 5xx
    victim_lost: int = 0
    attack_5xx: int = 0
    rss_before_mib: float | None = None
    rss_peak_mib: float | None = None
    rss_after_mib: float | None = None
    rss_settled_mib: float | None = None
    rss_drift_pct: float | None = None  # settled vs before
    server_cpu_pct: float | None = None  # during the attack; 100 = one core
    server_fds_peak: int | None = None
    server_exit: int | None = None  # when the server died during this attack
    outcome: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def p50(self, phase: str, kind: str) -> float | None:
        stats = self.victim.get(phase, {}).get(kind)
        return stats.p50_ms if stats is not None and stats.answered else None

    def ratio(self, kind: str) -> float | None:
        base, during = self.p50("baseline", kind), self.p50("during", kind)
        return round(during / base, 2) if base and during is not None else None


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    options = Options(
        duration=args.duration,
        connections=args.connections,
        big_clients=args.big_clients,
        settle_s=args.settle_s,
        baseline_s=args.baseline_s,
        victim_timeout_s=args.victim_timeout_s,
        victim_beam_size=args.victim_beam_size,
    )
    flags = shlex.split(args.flags)
    results: list[AttackResult] = []
    with contextlib.ExitStack() as outer:
        stack = outer.enter_context(contextlib.ExitStack())
        server: Running | None = None
        for letter in args.attacks:
            if server is None or args.fresh_server or server.process.poll() is not None:
                stack.close()
                server = stack.enter_context(service(args.bundle, flags))
            print(f"attack {letter} ({ATTACKS[letter]}) on {server.url} ...", flush=True)
            result = run_attack(server, letter, options)
            results.append(result)
            for line in describe(result):
                print(f"  {line}", flush=True)
    print()
    print_table(results)
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
    return 1 if any(r.failures for r in results) else 0


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.hostile_bench", description=__doc__.split("\n")[0]
    )
    p.add_argument("--bundle", type=Path, required=True)
    p.add_argument("--attacks", default="abcd", help="a subset of abcd, run in that order")
    p.add_argument("--duration", type=float, default=20.0, help="seconds per attack")
    p.add_argument("--connections", type=int, default=3000, help="attack b's idle sockets (N)")
    p.add_argument("--big-clients", type=int, default=8, help="attack d's clients")
    p.add_argument(
        "--settle-s", type=float, default=60.0, help="victim and RSS after each attack (seconds)"
    )
    p.add_argument("--baseline-s", type=float, default=5.0, help="victim before each attack")
    p.add_argument("--victim-timeout-s", type=float, default=30.0, help="then a request is lost")
    p.add_argument("--victim-beam-size", type=int, default=1)
    p.add_argument("--flags", default="", help="extra `python -m service` flags, one string")
    p.add_argument("--fresh-server", action="store_true", help="a new server for each attack")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = p.parse_args(argv)
    attacks = args.attacks.lower().replace(",", "")
    if not attacks or set(attacks) - set(ATTACKS) or len(set(attacks)) != len(attacks):
        p.error(f"--attacks: letters from abcd, each once (got {args.attacks!r})")
    args.attacks = attacks
    if min(args.duration, args.victim_timeout_s) <= 0 or min(args.settle_s, args.baseline_s) < 0:
        p.error("--duration and --victim-timeout-s must be > 0, --settle-s and --baseline-s >= 0")
    if min(args.connections, args.big_clients, args.victim_beam_size) < 1:
        p.error("--connections, --big-clients and --victim-beam-size must be at least 1")
    return args


# --- One attack, with the victim and the server's figures around it ---------------------------


def run_attack(server: Running, letter: str, options: Options) -> AttackResult:
    """Baseline, attack, settle: the victim runs throughout; the attack runs in a thread of its
    own, bounded by its deadline, and the 'during' phase lasts at least `duration` even when the
    attack ends sooner (the server closed its sockets)."""
    result = AttackResult(letter, ATTACKS[letter])
    pid = server.process.pid
    pair = _language_pair(server.url)
    victim = Victim(server.url, pair, options)
    sampler = Sampler(pid)
    outcome: dict[str, Any] = {}
    try:
        time.sleep(options.baseline_s)
        result.rss_before_mib = rss_mib(pid)
        cpu_before = cpu_seconds(pid)
        sampler.during.set()
        victim.phase(DURING)
        start = time.monotonic()
        deadline = start + options.duration

        def attack() -> None:
            try:
                outcome.update(ATTACK_FUNCTIONS[letter](server, pair, deadline, options))
            except Exception as e:  # reported, and the run goes on to the next attack
                outcome["error"] = repr(e)

        thread = threading.Thread(target=attack, name=f"attack-{letter}", daemon=True)
        thread.start()
        # Each attack stops by itself at its deadline (attack d: one more `duration` at most).
        thread.join(2 * options.duration + options.victim_timeout_s + 30)
        if thread.is_alive():
            outcome["error"] = "the attack did not stop in time (left running as a daemon)"
        time.sleep(max(0.0, deadline - time.monotonic()))
        result.seconds = round(time.monotonic() - start, 2)
        victim.phase(AFTER)
        sampler.during.clear()
        result.rss_after_mib = rss_mib(pid)
        cpu_after = cpu_seconds(pid)
        if cpu_before is not None and cpu_after is not None:
            result.server_cpu_pct = round(100 * (cpu_after - cpu_before) / result.seconds, 1)
        time.sleep(options.settle_s)
        result.rss_settled_mib = rss_mib(pid)
    finally:
        samples = victim.stop()
        sampler.stop()
    result.outcome = outcome
    result.rss_peak_mib = max(
        [v for v in (result.rss_before_mib, result.rss_after_mib, sampler.rss_peak) if v],
        default=None,
    )
    result.server_fds_peak = sampler.fds_peak
    result.server_exit = server.process.poll()
    _summarize_victim(result, samples)
    _judge(result)
    return result


def _language_pair(url: str) -> tuple[str, str]:
    pair = httpx.get(f"{url}/languages", timeout=30).json()[0]
    return pair["source"], pair["target"]


def _summarize_victim(result: AttackResult, samples: list[tuple[int, str, float, str]]) -> None:
    for number, phase in PHASES.items():
        kinds: dict[str, PhaseStats] = {}
        for kind in ("translate", "health"):
            mine = [(s, o) for p, k, s, o in samples if p == number and k == kind]
            answered = [s for s, o in mine if o.startswith("2")]
            kinds[kind] = PhaseStats(
                requests=len(mine),
                answered=len(answered),
                p50_ms=percentile_ms(answered, 50),
                p99_ms=percentile_ms(answered, 99),
                outcomes=dict(Counter(o for _, o in mine)),
            )
        result.victim[phase] = kinds
    for _, _, _, outcome in samples:
        if outcome.isdigit():
            if outcome.startswith("5"):
                result.victim_5xx += 1
            elif not outcome.startswith("2"):
                result.victim_errors += 1
        else:
            result.victim_lost += 1


def _judge(result: AttackResult) -> None:
    """Correctness failures (they set the exit status); the latency and memory goals are only
    printed."""
    before, settled = result.rss_before_mib, result.rss_settled_mib
    if before and settled is not None:
        result.rss_drift_pct = round(100 * (settled - before) / before, 1)
    # A 503 to an attacker is the server shedding it (a connection over the limit, or closed
    # to make room): the defence, not a failure. Any other 5xx is one.
    result.attack_5xx = sum(
        count
        for status, count in _attack_statuses(result.outcome).items()
        if status.isdigit() and status.startswith("5") and status != "503"
    )
    if result.victim_5xx:
        result.failures.append(f"victim got {result.victim_5xx} 5xx")
    if result.victim_lost:
        result.failures.append(f"victim lost {result.victim_lost} requests")
    if result.attack_5xx:
        result.failures.append(f"attacker got {result.attack_5xx} 5xx")
    if result.server_exit is not None:
        result.failures.append(f"server exited with {result.server_exit}")
    if "error" in result.outcome:
        result.failures.append(f"attack failed: {result.outcome['error']}")


def _attack_statuses(outcome: dict[str, Any]) -> Counter[str]:
    """Every status the attacker saw, whatever the attack's report looks like."""
    total: Counter[str] = Counter(outcome.get("statuses", {}))  # attack d
    if outcome.get("status"):  # attack a
        total[str(outcome["status"])] += 1
    for per in outcome.get("cases", {}).values():  # attack c
        total.update(per["statuses"])
    for per in outcome.get("kinds", {}).values():  # attack b
        total.update(per["statuses"])
    return total


# --- The server's figures ---------------------------------------------------------------------


def rss_mib(pid: int) -> float | None:
    """VmRSS of process `pid` in MiB (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def cpu_seconds(pid: int) -> float | None:
    """User plus system CPU time of process `pid` (all its threads) so far."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def open_fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def fd_limit(pid: int) -> int | None:
    """The soft 'Max open files' of process `pid`."""
    try:
        with open(f"/proc/{pid}/limits", encoding="ascii") as f:
            for line in f:
                if line.startswith("Max open files"):
                    soft = line.split()[3]
                    return int(soft) if soft.isdigit() else None
    except OSError:
        return None
    return None


class Sampler:
    """The server's RSS (every 0.1 s) and open descriptors (every 0.5 s) while `during` is set:
    the peaks an attack drives them to."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.during = threading.Event()
        self.rss_peak: float | None = None
        self.fds_peak: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        tick = 0
        while not self._stop.wait(0.1):
            if not self.during.is_set():
                continue
            rss = rss_mib(self.pid)
            if rss is not None:
                self.rss_peak = max(rss, self.rss_peak or 0.0)
            if tick % 5 == 0:
                fds = open_fds(self.pid)
                if fds is not None:
                    self.fds_peak = max(fds, self.fds_peak or 0)
            tick += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


# --- The victim: its own process --------------------------------------------------------------


class Victim:
    """The ordinary client, in a process of its own (spawned: no forked copy of this process's
    threads and sockets). Started, and warmed up, on construction; `stop` returns its samples:
    (phase, kind, seconds, status code or exception name)."""

    def __init__(self, url: str, pair: tuple[str, str], options: Options) -> None:
        context = multiprocessing.get_context("spawn")
        self._phase: Synchronized[int] = context.Value("i", WARMUP)
        self._stop = context.Event()
        ready = context.Event()
        self._results: Queue[list[tuple[int, str, float, str]]] = context.Queue()
        self._timeout = options.victim_timeout_s
        self._process = context.Process(
            target=_victim,
            args=(url, pair, options.victim_beam_size, options.victim_timeout_s,
                  self._phase, self._stop, ready, self._results),
            name="victim",
            daemon=True,
        )  # fmt: skip
        self._process.start()
        if not ready.wait(60 + 2 * options.victim_timeout_s):
            self.stop()
            raise RuntimeError("the victim did not warm up")
        self.phase(BASELINE)

    def phase(self, number: int) -> None:
        self._phase.value = number

    def stop(self) -> list[tuple[int, str, float, str]]:
        self._stop.set()
        samples: list[tuple[int, str, float, str]] = []
        with contextlib.suppress(Exception):
            samples = self._results.get(timeout=self._timeout + 30)
        self._process.join(10)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(10)
        return samples


def phase_of(sent_in: int, answered_in: int) -> int:
    """The phase a victim request counts in: 'during' when it overlapped the attack at all
    (sent just before it and answered in it, or sent in it and answered after), else the phase
    it was sent in."""
    return DURING if sent_in <= DURING <= answered_in else sent_in


def _victim(
    url: str,
    pair: tuple[str, str],
    beam_size: int,
    timeout: float,
    phase: Synchronized[int],
    stop: Event,
    ready: Event,
    results: Queue[list[tuple[int, str, float, str]]],
) -> None:
    samples: list[tuple[int, str, float, str]] = []
    # No keep-alive: each request connects anew, as most clients of a public service would.
    fresh = httpx.Limits(max_keepalive_connections=0)
    with httpx.Client(base_url=url, timeout=timeout, limits=fresh) as client:

        def send(i: int) -> tuple[str, float, str]:
            kind = "translate" if i % 2 == 0 else "health"
            body = {"text": DEFAULT_TEXTS[(i // 2) % len(DEFAULT_TEXTS)], "source": pair[0],
                    "target": pair[1], "beam_size": beam_size}  # fmt: skip
            sent = time.perf_counter()
            try:
                if kind == "translate":
                    response = client.post("/translate", json=body)
                else:
                    response = client.get("/health")
                outcome = str(response.status_code)
            except httpx.HTTPError as e:
                outcome = type(e).__name__
            return kind, time.perf_counter() - sent, outcome

        for i in range(4):  # warm-up: imports, the first connection, the model's first calls
            send(i)
        ready.set()
        for i in range(VICTIM_MAX_REQUESTS):
            if stop.is_set():
                break
            sent_in = phase.value
            kind, seconds, outcome = send(i)
            if sent_in != WARMUP:
                samples.append((phase_of(sent_in, phase.value), kind, seconds, outcome))
            stop.wait(VICTIM_PAUSE_S)
    results.put(samples)


# --- The attacks ------------------------------------------------------------------------------


def _status(data: bytes) -> str | None:
    """The status code of an HTTP/1.x answer's first bytes."""
    parts = data.split(b"\r\n", 1)[0].split()
    if len(parts) >= 2 and parts[0].startswith(b"HTTP/") and parts[1].isdigit():
        return parts[1].decode()
    return None


def header_trickle(
    server: Running, pair: tuple[str, str], deadline: float, options: Options
) -> dict[str, Any]:
    """Attack a: one header that never ends, sent as fast as the server reads it."""
    start = time.monotonic()
    sent = 0
    said = b""
    closed: str | None = None  # how the server ended it
    closed_after: float | None = None
    chunk = b"a" * TRICKLE_CHUNK
    with socket.create_connection((HOST, server.port), timeout=10) as sock:
        sock.settimeout(0.5)
        try:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ")
            while time.monotonic() < deadline:
                if _readable(sock):
                    data = sock.recv(4096)
                    if not data:
                        closed = "EOF"
                        break
                    said = (said + data)[:200]
                    continue
                with contextlib.suppress(TimeoutError):  # the server is not reading: try again
                    sent += sock.send(chunk)
        except ConnectionError as e:
            closed = type(e).__name__
        if closed is not None:
            closed_after = round(time.monotonic() - start, 2)
    return {
        "bytes_sent": sent,
        "mib_sent": round(sent / 2**20, 1),
        "closed_by_server": closed is not None,
        "closed_how": closed,
        "closed_after_s": closed_after,
        "answer": said.split(b"\r\n", 1)[0].decode("latin-1") if said else None,
        "status": _status(said),
    }


def _readable(sock: socket.socket) -> bool:
    """Whether `sock` has something to read (data, EOF or a reset) right now."""
    with selectors.DefaultSelector() as selector:
        selector.register(sock, selectors.EVENT_READ)
        return bool(selector.select(0))


def connections_to_open(n: int, fd_room: int) -> int:
    """N, capped so that N + 2 * (N // 3) sockets fit in `fd_room` descriptors."""
    n = max(0, min(n, fd_room * 3 // 5 + 2))
    while n > 0 and n + 2 * (n // 3) > fd_room:
        n -= 1
    return n


def raise_fd_limit() -> int:
    """This process's RLIMIT_NOFILE soft limit, raised to the hard limit; the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = max(soft, 1 << 20)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


@dataclass
class _Conn:
    kind: str
    sock: socket.socket
    opened: float
    closed_after: float | None = None
    how: str | None = None
    said: bytes = b""


def idle_connections(
    server: Running, pair: tuple[str, str], deadline: float, options: Options
) -> dict[str, Any]:
    """Attack b: open the sockets (until the deadline at most), then watch them for the server
    closing each (EOF or a reset) until the deadline; close the rest."""
    limit = raise_fd_limit()
    in_use = open_fds(os.getpid()) or 0
    n = connections_to_open(options.connections, limit - in_use - FD_MARGIN)
    half_header = b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/js"
    headers = (
        b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100\r\n\r\n"
    )
    half_body = f'{{"text": "{"x" * 40}'.encode()[:50]
    payloads = {"idle": b"", "half header": half_header, "half body": headers + half_body}
    kinds = ["idle"] * n + ["half header"] * (n // 3) + ["half body"] * (n // 3)
    random.Random(0).shuffle(kinds)
    open_failed: dict[str, Counter[str]] = {kind: Counter() for kind in payloads}
    conns: list[_Conn] = []
    selector = selectors.DefaultSelector()  # epoll: select() stops at 1024 descriptors

    def watch(timeout: float) -> None:
        for key, _ in selector.select(timeout):
            conn: _Conn = key.data
            try:
                data = conn.sock.recv(4096)
            except BlockingIOError:
                continue
            except ConnectionError as e:
                data, conn.how = b"", type(e).__name__
            if data:
                conn.said = (conn.said + data)[:200]
                continue
            conn.how = conn.how or "EOF"
            conn.closed_after = time.monotonic() - conn.opened
            selector.unregister(conn.sock)
            conn.sock.close()

    start = time.monotonic()
    try:
        for i, kind in enumerate(kinds):
            if time.monotonic() >= deadline:
                open_failed[kind]["no time left"] += 1
                continue
            try:
                sock = socket.create_connection(
                    (HOST, server.port), timeout=max(0.1, min(5.0, deadline - time.monotonic()))
                )
            except OSError as e:
                open_failed[kind][type(e).__name__] += 1
                continue
            try:
                sock.sendall(payloads[kind])
            except OSError as e:
                open_failed[kind][type(e).__name__] += 1
                sock.close()
                continue
            sock.setblocking(False)
            conn = _Conn(kind, sock, time.monotonic())
            conns.append(conn)
            selector.register(sock, selectors.EVENT_READ, conn)
            if i % 100 == 99:
                watch(0)
        opening_s = time.monotonic() - start
        while selector.get_map() and (left := deadline - time.monotonic()) > 0:
            watch(min(0.2, left))
    finally:
        for conn in conns:
            if conn.closed_after is None:
                with contextlib.suppress(KeyError, ValueError):
                    selector.unregister(conn.sock)
                conn.sock.close()
        selector.close()
    report: dict[str, Any] = {}
    for kind in payloads:
        mine = [c for c in conns if c.kind == kind]
        closed = [c.closed_after for c in mine if c.closed_after is not None]
        statuses = Counter(_status(c.said) or "none" for c in mine if c.closed_after is not None)
        report[kind] = {
            "opened": len(mine),
            "open_failed": dict(open_failed[kind]),
            "closed_by_server": len(closed),
            "open_at_end": len(mine) - len(closed),
            "close_p50_s": round(statistics.median(closed), 2) if closed else None,
            "close_max_s": round(max(closed), 2) if closed else None,
            "closed_how": dict(Counter(c.how for c in mine if c.how)),
            "statuses": {k: v for k, v in statuses.items() if k != "none"},
        }
    return {
        "connections": n,
        "connections_asked": options.connections,
        "sockets": len(kinds),
        "opening_s": round(opening_s, 2),
        "fd_limit_here": limit,
        "server_fd_limit": fd_limit(server.process.pid),
        "kinds": report,
    }


def bad_inputs(pair: tuple[str, str]) -> list[tuple[str, str, bytes]]:
    """(case, path, JSON body bytes). json.dumps keeps a lone surrogate as the escape
    `\\ud800`, valid JSON that decodes to a str UTF-8 cannot encode; httpx's json= would refuse
    to encode it, so the bodies go as bytes."""
    source, target = pair

    def body(**fields: object) -> bytes:
        return json.dumps({"source": source, "target": target, **fields}).encode("ascii")

    nested = b"[" * NESTING + b"]" * NESTING
    libre_tail = f', "source": "{source}", "target": "{target}"}}'.encode()
    return [
        ("surrogate in text", "/translate", body(text="\ud800 dog")),
        ("surrogate as source", "/translate", json.dumps(
            {"text": "A dog runs.", "source": "\ud800", "target": target}).encode("ascii")),
        ("invalid UTF-8 in text", "/translate",
         body(text="@@ dog").replace(b"@@", b"\xed\xa0\x80")),
        ("surrogate in q (LibreTranslate)", "/libretranslate/translate", json.dumps(
            {"q": "\ud800 dog", "source": source, "target": target}).encode("ascii")),
        (f"q nested {NESTING:,} deep (LibreTranslate)", "/libretranslate/translate",
         b'{"q": ' + nested + libre_tail),
        (f"text nested {NESTING:,} deep", "/translate", b'{"text": ' + nested + libre_tail),
        ("control characters only", "/translate", body(text="\x00\x01\x02\x03\x1b\x7f\x85")),
        ('beam_size "8"', "/translate", body(text="A dog runs.", beam_size="8")),
        ("beam_size true", "/translate", body(text="A dog runs.", beam_size=True)),
    ]  # fmt: skip


def bad_input(
    server: Running, pair: tuple[str, str], deadline: float, options: Options
) -> dict[str, Any]:
    """Attack c: the cases in turn, one request at a time, until the deadline."""
    cases = bad_inputs(pair)
    statuses: dict[str, Counter[str]] = {name: Counter() for name, _, _ in cases}
    slowest: dict[str, float] = dict.fromkeys(statuses, 0.0)
    headers = {"Content-Type": "application/json"}
    rounds = 0
    # A new connection each: after some failures the server closes the connection, and the
    # next request on it would fail without an answer, hiding that case's status.
    fresh = httpx.Limits(max_keepalive_connections=0)
    with httpx.Client(base_url=server.url, timeout=30, limits=fresh) as client:
        while rounds < BAD_INPUT_MAX_ROUNDS and time.monotonic() < deadline:
            rounds += 1
            for name, path, content in cases:
                if time.monotonic() >= deadline:
                    break
                sent = time.perf_counter()
                try:
                    status = str(client.post(path, content=content, headers=headers).status_code)
                except httpx.HTTPError as e:
                    status = type(e).__name__
                statuses[name][status] += 1
                slowest[name] = max(slowest[name], time.perf_counter() - sent)
    return {
        "rounds": rounds,
        "cases": {
            name: {"statuses": dict(statuses[name]), "slowest_ms": round(1000 * slowest[name], 1)}
            for name in statuses
        },
    }


def big_texts(
    server: Running, pair: tuple[str, str], deadline: float, options: Options
) -> dict[str, Any]:
    """Attack d: `big_clients` threads, each POSTing the ~1 MB text again and again; no new
    request after the deadline, one in flight then has `duration` more seconds."""
    content = json.dumps({"text": BIG_TEXT, "source": pair[0], "target": pair[1]}).encode()
    headers = {"Content-Type": "application/json"}
    answers: list[tuple[str, float]] = []
    lock = threading.Lock()

    def client_loop() -> None:
        with httpx.Client(base_url=server.url) as client:
            for _ in range(BIG_CLIENT_MAX_REQUESTS):
                now = time.monotonic()
                if now >= deadline:
                    return
                timeout = httpx.Timeout(30.0, read=deadline + options.duration - now)
                sent = time.perf_counter()
                try:
                    response = client.post("/translate", content=content, headers=headers,
                                           timeout=timeout)  # fmt: skip
                    status = str(response.status_code)
                except httpx.HTTPError as e:
                    status = type(e).__name__
                with lock:
                    answers.append((status, time.perf_counter() - sent))

    threads = [
        threading.Thread(target=client_loop, name=f"big-{i}", daemon=True)
        for i in range(options.big_clients)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(2 * options.duration + 60)
    by_status: dict[str, list[float]] = {}
    for status, seconds in answers:
        by_status.setdefault(status, []).append(seconds)
    return {
        "body_bytes": len(content),
        "requests": len(answers),
        "statuses": {status: len(times) for status, times in by_status.items()},
        "seconds_per_answer": {
            status: {
                "p50": round(statistics.median(times), 2),
                "max": round(max(times), 2),
            }
            for status, times in by_status.items()
        },
    }


ATTACK_FUNCTIONS: dict[
    str, Callable[[Running, tuple[str, str], float, Options], dict[str, Any]]
] = {"a": header_trickle, "b": idle_connections, "c": bad_input, "d": big_texts}


# --- Reporting --------------------------------------------------------------------------------


def describe(r: AttackResult) -> list[str]:
    """The attack's own outcome and the victim's figures by phase, in words."""
    o = r.outcome
    lines: list[str] = []
    if "error" in o:
        lines.append(f"attack error: {o['error']}")
    if r.attack == "a" and "bytes_sent" in o:
        end = (
            f"the server closed it after {o['closed_after_s']} s ({o['closed_how']})"
            if o["closed_by_server"]
            else "the server never closed it"
        )
        answer = f", answering {o['answer']!r}" if o["answer"] else ", answering nothing"
        lines.append(f"sent {o['mib_sent']} MiB of one header line; {end}{answer}")
    elif r.attack == "b" and "kinds" in o:
        capped = (
            f" (asked {o['connections_asked']}, capped by RLIMIT_NOFILE {o['fd_limit_here']})"
            if o["connections"] < o["connections_asked"]
            else ""
        )
        lines.append(
            f"N = {o['connections']}{capped}: {o['sockets']} sockets opened in {o['opening_s']} s;"
            f" server fd limit {o['server_fd_limit']}, peak open {r.server_fds_peak}"
        )
        for kind, k in o["kinds"].items():
            failed = f" ({sum(k['open_failed'].values())} failed: {k['open_failed']})"
            lines.append(
                f"{kind:<11} {k['opened']:>5} open{failed if k['open_failed'] else ''}, "
                f"{k['closed_by_server']} closed by the server (p50 {k['close_p50_s']} s, max "
                f"{k['close_max_s']} s, {k['closed_how'] or 'none'}; answers "
                f"{k['statuses'] or 'none'}), {k['open_at_end']} still open at the end"
            )
    elif r.attack == "c" and "cases" in o:
        for name, case in o["cases"].items():
            mark = "  <- 5xx" if any(s.startswith("5") for s in case["statuses"]) else ""
            lines.append(f"{name:<40} {case['statuses']} (slowest {case['slowest_ms']} ms){mark}")
    elif r.attack == "d" and "statuses" in o:
        lines.append(
            f"{o['requests']} requests of {o['body_bytes']:,} bytes: {o['statuses']}; seconds "
            f"per answer by status {o['seconds_per_answer']}"
        )
    for phase, kinds in r.victim.items():
        parts = []
        for kind, s in kinds.items():
            others = {k: v for k, v in s.outcomes.items() if not k.startswith("2")}
            parts.append(
                f"{kind} {s.answered}/{s.requests} answered, p50 {s.p50_ms} p99 {s.p99_ms} ms"
                + (f" {others}" if others else "")
            )
        lines.append(f"victim {phase:<8}: " + "; ".join(parts))
    lines.append(
        f"server: CPU {r.server_cpu_pct} % during (100 = one core), RSS {r.rss_before_mib} -> "
        f"peak {r.rss_peak_mib} -> {r.rss_after_mib} -> settled {r.rss_settled_mib} MiB"
    )
    lines.extend(f"FAILED: {f}" for f in r.failures)
    return lines


def _ms(value: float | None) -> str:
    return f"{value:.1f}" if value is not None else "-"


def _ratio(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}x" + ("!" if value > RATIO_GOAL else " ")


def _mib(value: float | None) -> str:
    return f"{value:.0f}" if value is not None else "-"


def print_table(results: list[AttackResult]) -> None:
    print(
        f"{'':<22}{'translate p50 ms':^27}{'health p50 ms':^27}{'victim':^11}{'server RSS MiB':^37}"
    )
    print(
        f"{'attack':<22}{'before':>8}{'during':>10}{'ratio':>9}{'before':>8}{'during':>10}"
        f"{'ratio':>9}{'5xx':>5}{'lost':>6}{'before':>8}{'peak':>7}{'after':>7}{'settled':>8}"
        f"{'drift':>7}  attacker 5xx but 503"
    )
    for r in results:
        drift = (
            f"{r.rss_drift_pct:+.0f}%" + ("!" if abs(r.rss_drift_pct) > RSS_DRIFT_GOAL_PCT else "")
            if r.rss_drift_pct is not None
            else "-"
        )
        print(
            f"{r.attack + ' ' + r.name:<22}"
            f"{_ms(r.p50('baseline', 'translate')):>8}{_ms(r.p50('during', 'translate')):>10}"
            f"{_ratio(r.ratio('translate')):>9}"
            f"{_ms(r.p50('baseline', 'health')):>8}{_ms(r.p50('during', 'health')):>10}"
            f"{_ratio(r.ratio('health')):>9}"
            f"{r.victim_5xx:>5}{r.victim_lost:>6}"
            f"{_mib(r.rss_before_mib):>8}{_mib(r.rss_peak_mib):>7}{_mib(r.rss_after_mib):>7}"
            f"{_mib(r.rss_settled_mib):>8}{drift:>7}  {r.attack_5xx}"
        )
    print(
        f"! = goal missed: p50 during <= {RATIO_GOAL:g}x before; settled RSS within "
        f"{RSS_DRIFT_GOAL_PCT:g} % of before. Goals are printed, not enforced; 5xx, lost "
        "requests or a dead server set exit status 1."
    )
    failed = [f"{r.attack}: {'; '.join(r.failures)}" for r in results if r.failures]
    print("FAILED: " + " | ".join(failed) if failed else "OK: no 5xx, nothing lost")


if __name__ == "__main__":
    sys.exit(main())
