#!/usr/bin/env python3
"""bench/control/bench_control.py — gradd's control plane under load, while a job trains.

Starts a private gradd (temporary socket and state dir), submits a small GPT
job (threads = 1, so the event loop has the other core), then:

  phase A  no clients for PHASE seconds
  phase B  CLIENTS persistent connections issue status and list requests
           alternately, at RATE requests/s in all (open loop: every client
           has a fixed schedule of RATE/CLIENTS req/s, offset from the
           others), recording each request's latency (send -> full answer)
  phase C  no clients again (to see drift)

The job's per-step times come from its metrics.jsonl (log_every = 1, flushed
every step); the step a phase boundary falls in is dropped from both sides.
Slowdown = median step_ms over B / median step_ms over A u C.

Then the connection test: CONNS connections are opened and held at once, a
status request is written on every one, and every answer is read back.

JSON lines on stdout (bench/ convention):
  {"bench":..,"metric":..,"value":..,"unit":..,"peer":..,"peer_value":..,"ratio":..,...}
progress on stderr.  Python stdlib only.
"""
import argparse
import asyncio
import json
import os
import resource
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time

PROTOCOL_VERSION = 1


# ---- hand-made protobuf: the integration tests' helpers, shared -----------------------------

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "integration"))
from harness import field_bytes, field_varint, frame, parse_fields  # noqa: E402

STATUS_FRAME = frame(field_varint(1, PROTOCOL_VERSION) + field_bytes(10, b""))
LIST_FRAME = frame(field_varint(1, PROTOCOL_VERSION) + field_bytes(21, b""))


def response_kind(body):
    """The Response oneof field number of body (its field >= 9), or None."""
    try:
        fields = parse_fields(body)
    except (IndexError, ValueError):
        return None
    kinds = [n for n in fields if n >= 9]
    return kinds[0] if kinds else None


def log(msg):
    print("bench_control: " + msg, file=sys.stderr, flush=True)


# ---- CPU accounting -------------------------------------------------------------------------

CLK = os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid):
    """utime+stime of a whole process, seconds."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def thread_cpu_s(pid):
    """{tid: (comm, utime+stime seconds)} for every thread of pid."""
    out = {}
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                s = f.read()
        except OSError:
            continue
        comm = s[s.index("(") + 1:s.rindex(")")]
        fields = s.rsplit(")", 1)[1].split()
        out[int(tid)] = (comm, (int(fields[11]) + int(fields[12])) / CLK)
    return out


def system_busy_s():
    """Busy CPU seconds of the whole machine (all cores), from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return (sum(v[:8]) - idle) / CLK


def self_cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class CpuMark:
    def __init__(self, pid):
        self.t = time.monotonic()
        self.client = self_cpu_s()
        self.daemon = proc_cpu_s(pid)
        self.threads = thread_cpu_s(pid)
        self.system = system_busy_s()


def cpu_between(a, b):
    wall = b.t - a.t
    d = {"wall_s": round(wall, 3),
         "client_cpu_pct": round(100 * (b.client - a.client) / wall, 1),
         "daemon_cpu_pct": round(100 * (b.daemon - a.daemon) / wall, 1)}
    # everything else on the machine (other users' work skews these figures)
    d["other_cpu_pct"] = round(100 * ((b.system - a.system) - (b.client - a.client) - (b.daemon - a.daemon)) / wall, 1)
    th = {}
    for tid, (comm, s) in b.threads.items():
        s0 = a.threads.get(tid, (comm, 0.0))[1]
        pct = 100 * (s - s0) / wall
        if pct >= 0.5:
            th["%s/%d" % (comm, tid)] = round(pct, 1)
    d["daemon_threads_cpu_pct"] = th
    return d


# ---- the job ---------------------------------------------------------------------------------

JOB = """\
[job]
name = control-load
[model]
type = gpt
layers = {layers}
heads = {heads}
width = {width}
context = {context}
vocab = 256
[data]
format = text
train = {train}
val_fraction = 0.05
[train]
steps = {steps}
batch = {batch}
micro_batch = {batch}
lr = 1e-3
warmup = 10
threads = 1
eval_every = 0
eval_batches = 1
[output]
dir = {out}
checkpoint_every = 0
log_every = 1
"""


def metrics_lines(path):
    try:
        with open(path) as f:
            data = f.read()
    except FileNotFoundError:
        return []
    # only complete lines
    return data[:data.rfind("\n") + 1].splitlines() if "\n" in data else []


def step_ms(lines):
    return [json.loads(l)["step_ms"] for l in lines if l.strip()]


# ---- load phase ------------------------------------------------------------------------------

async def load_phase(sock, clients, rate, duration):
    """Open loop: client c sends at t0 + c*gap + k*period; alternates status/list."""
    per_client = rate / clients
    period = 1.0 / per_client
    conns = []
    for _ in range(clients):
        conns.append(await asyncio.open_unix_connection(sock))
    lat = {"status": [], "list": []}
    late = []          # how far behind schedule each send went out (s)
    errors = []
    t0 = time.perf_counter() + 0.05

    async def client(c, reader, writer):
        k = 0
        while True:
            sched = t0 + c * (period / clients) + k * period
            if sched - t0 >= duration:
                break
            now = time.perf_counter()
            if sched > now:
                await asyncio.sleep(sched - now)
            kind = "status" if (k + c) % 2 == 0 else "list"
            ts = time.perf_counter()
            late.append(ts - sched)
            writer.write(STATUS_FRAME if kind == "status" else LIST_FRAME)
            try:
                hdr = await reader.readexactly(4)
                body = await reader.readexactly(struct.unpack(">I", hdr)[0])
            except (asyncio.IncompleteReadError, ConnectionError) as e:
                errors.append("client %d: %r" % (c, e))
                return
            te = time.perf_counter()
            want = 10 if kind == "status" else 21
            if response_kind(body) != want:
                errors.append("client %d: %s answered with field %s" % (c, kind, response_kind(body)))
            lat[kind].append(te - ts)
            k += 1

    t_start = time.perf_counter()
    await asyncio.gather(*(client(c, r, w) for c, (r, w) in enumerate(conns)))
    t_end = time.perf_counter()
    for _, w in conns:
        w.close()
    for _, w in conns:
        try:
            await w.wait_closed()
        except ConnectionError:
            pass
    return lat, late, errors, t_end - t_start


async def conn_test(sock, n, timeout):
    t0 = time.perf_counter()
    opened, open_err = [], []

    async def op():
        try:
            opened.append(await asyncio.open_unix_connection(sock))
        except OSError as e:
            open_err.append(repr(e))

    # open in batches so the listen backlog is never the limit being measured
    for i in range(0, n, 100):
        await asyncio.gather(*(op() for _ in range(min(100, n - i))))
    t_open = time.perf_counter()
    for _, w in opened:
        w.write(STATUS_FRAME)

    answered, failed = 0, []

    async def rd(r):
        nonlocal answered
        try:
            hdr = await r.readexactly(4)
            body = await r.readexactly(struct.unpack(">I", hdr)[0])
            if response_kind(body) == 10:
                answered += 1
            else:
                failed.append("field %s" % response_kind(body))
        except (asyncio.IncompleteReadError, ConnectionError) as e:
            failed.append(repr(e))

    try:
        await asyncio.wait_for(asyncio.gather(*(rd(r) for r, _ in opened)), timeout)
    except asyncio.TimeoutError:
        failed.append("timeout")
    t_end = time.perf_counter()
    for _, w in opened:
        w.close()
    return {"opened": len(opened), "open_errors": open_err[:5], "n_open_errors": len(open_err),
            "answered": answered, "failed": failed[:5], "n_failed": len(failed),
            "open_ms": (t_open - t0) * 1e3, "total_ms": (t_end - t0) * 1e3,
            "answer_ms": (t_end - t_open) * 1e3}


def pct(xs, p):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    i = min(len(xs) - 1, max(0, int(round(p / 100 * len(xs) + 0.5)) - 1))
    return xs[i]


def emit(**kw):
    line = {"bench": kw.pop("bench"), "metric": kw.pop("metric"), "value": kw.pop("value"),
            "unit": kw.pop("unit"), "peer": kw.pop("peer"), "peer_value": kw.pop("peer_value")}
    pv = line["peer_value"]
    line["ratio"] = round(line["value"] / pv, 4) if pv else None
    line.update(kw)
    print(json.dumps(line, separators=(",", ":")), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gradd", default="gradd")
    ap.add_argument("--gradctl", default="gradctl")
    ap.add_argument("--phase", type=float, default=15.0, help="seconds per phase")
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--rate", type=float, default=1000.0, help="requests/s, all clients together")
    ap.add_argument("--conns", type=int, default=1000)
    ap.add_argument("--warmup-steps", type=int, default=30)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    a = ap.parse_args()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = a.conns + 256
    if soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        log("RLIMIT_NOFILE %d -> %d" % (soft, new))

    d = tempfile.mkdtemp(prefix="gradd-ctl-")
    os.chmod(d, 0o755)
    sock = os.path.join(d, "gradd.sock")
    conf = os.path.join(d, "gradd.conf")
    with open(conf, "w") as f:
        f.write("[daemon]\nclient_timeout = 60s\nmax_jobs_per_device = 1\n[cuda]\nenabled = false\n")
    train = os.path.join(d, "corpus.txt")
    with open(train, "w") as f:
        for i in range(4000):
            f.write("the quick brown fox %d jumps over the lazy dog; pack my box %d.\n" % (i % 97, i % 31))
    os.chmod(train, 0o644)
    out = os.path.join(d, "out")
    cfg = os.path.join(d, "job.cfg")
    with open(cfg, "w") as f:
        f.write(JOB.format(layers=a.layers, heads=a.heads, width=a.width, context=a.context, batch=a.batch,
                           train=train, out=out, steps=1000000))
    os.chmod(cfg, 0o644)
    dlog = open(os.path.join(d, "gradd.log"), "w")
    proc = subprocess.Popen([a.gradd, "-c", conf, "-s", sock, "--state-dir", os.path.join(d, "state")],
                            stdout=dlog, stderr=subprocess.STDOUT)
    rc = 1
    try:
        deadline = time.time() + 20
        while True:
            if proc.poll() is not None:
                raise SystemExit("gradd exited %d" % proc.returncode)
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.connect(sock)
                break
            except OSError:
                if time.time() > deadline:
                    raise SystemExit("gradd did not listen")
                time.sleep(0.02)
        r = subprocess.run([a.gradctl, "-s", sock, "submit", cfg], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise SystemExit("submit failed: %s %s" % (r.stdout, r.stderr))
        jid = r.stdout.split()[1]
        log("submitted job %s: %s" % (jid, r.stdout.strip()))
        metrics = os.path.join(out, "metrics.jsonl")
        deadline = time.time() + 120
        while len(metrics_lines(metrics)) < a.warmup_steps:
            if time.time() > deadline or proc.poll() is not None:
                raise SystemExit("job did not reach %d steps" % a.warmup_steps)
            time.sleep(0.1)

        marks, cpu = {}, {}

        def mark(name):
            marks[name] = len(metrics_lines(metrics))
            cpu[name] = CpuMark(proc.pid)

        mark("a0")
        time.sleep(a.phase)
        mark("a1")
        log("phase A: steps %d..%d" % (marks["a0"], marks["a1"]))
        lat, late, errors, b_wall = asyncio.run(load_phase(sock, a.clients, a.rate, a.phase))
        mark("b1")
        log("phase B: steps %d..%d, %d errors" % (marks["a1"], marks["b1"], len(errors)))
        time.sleep(a.phase)
        mark("c1")
        log("phase C: steps %d..%d" % (marks["b1"], marks["c1"]))

        lines = metrics_lines(metrics)
        # drop the step each boundary falls in (the first line after the mark)
        A = step_ms(lines[marks["a0"] + 1:marks["a1"]])
        B = step_ms(lines[marks["a1"] + 1:marks["b1"]])
        C = step_ms(lines[marks["b1"] + 1:marks["c1"]])
        base = statistics.median(A + C)
        mb = statistics.median(B)
        cpu_a = cpu_between(cpu["a0"], cpu["a1"])
        cpu_b = cpu_between(cpu["a1"], cpu["b1"])
        cpu_c = cpu_between(cpu["b1"], cpu["c1"])
        log("cpu A %s" % cpu_a)
        log("cpu B %s" % cpu_b)
        log("cpu C %s" % cpu_c)
        all_lat = lat["status"] + lat["list"]
        n_req = len(all_lat)
        emit(bench="control_load", metric="train_step_ms_under_load", value=round(mb, 4), unit="ms",
             peer="same job, no clients (phases A+C)", peer_value=round(base, 4),
             phase_a_ms=round(statistics.median(A), 4), phase_c_ms=round(statistics.median(C), 4),
             steps_a=len(A), steps_b=len(B), steps_c=len(C),
             mean_b_ms=round(statistics.mean(B), 4), mean_ac_ms=round(statistics.mean(A + C), 4),
             goal_ratio_below=1.03, client_cpu_pct_b=cpu_b["client_cpu_pct"],
             daemon_cpu_pct_a=cpu_a["daemon_cpu_pct"], daemon_cpu_pct_b=cpu_b["daemon_cpu_pct"],
             daemon_cpu_pct_c=cpu_c["daemon_cpu_pct"],
             other_cpu_pct_a=cpu_a["other_cpu_pct"], other_cpu_pct_b=cpu_b["other_cpu_pct"],
             other_cpu_pct_c=cpu_c["other_cpu_pct"], daemon_threads_b=cpu_b["daemon_threads_cpu_pct"],
             nproc=os.cpu_count())
        for p in (50, 99):
            emit(bench="control_load", metric="request_latency_p%d" % p, value=round(pct(all_lat, p) * 1e3, 4),
                 unit="ms", peer="goal" if p == 99 else None, peer_value=1.0 if p == 99 else None,
                 status_ms=round(pct(lat["status"], p) * 1e3, 4), list_ms=round(pct(lat["list"], p) * 1e3, 4),
                 requests=n_req, errors=len(errors), clients=a.clients,
                 p999_ms=round(pct(all_lat, 99.9) * 1e3, 4), max_ms=round(max(all_lat) * 1e3, 4),
                 send_late_p99_ms=round(pct(late, 99) * 1e3, 4))
        emit(bench="control_load", metric="request_rate", value=round(n_req / b_wall, 1), unit="req/s",
             peer="goal", peer_value=a.rate, clients=a.clients, seconds=round(b_wall, 3),
             client_cpu_pct=cpu_b["client_cpu_pct"],
             client_cpu_us_per_req=round((cpu["b1"].client - cpu["a1"].client) / max(1, n_req) * 1e6, 1))
        if errors:
            log("errors: %s" % errors[:5])

        m0 = CpuMark(proc.pid)
        ct = asyncio.run(conn_test(sock, a.conns, 60))
        m1 = CpuMark(proc.pid)
        emit(bench="control_load", metric="concurrent_connections_answered", value=ct["answered"], unit="conns",
             peer="goal", peer_value=a.conns, opened=ct["opened"], n_open_errors=ct["n_open_errors"],
             n_failed=ct["n_failed"], total_ms=round(ct["total_ms"], 1), open_ms=round(ct["open_ms"], 1),
             answer_ms=round(ct["answer_ms"], 1), client_cpu_s=round(m1.client - m0.client, 3),
             daemon_alive=proc.poll() is None)
        if ct["failed"] or ct["open_errors"]:
            log("connection test problems: %s %s" % (ct["open_errors"], ct["failed"]))
        subprocess.run([a.gradctl, "-s", sock, "cancel", jid], capture_output=True, timeout=60)
        rc = 0
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        dlog.close()
        if a.keep:
            log("kept %s" % d)
        else:
            shutil.rmtree(d, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
