"""The memory pool over the socket: gradctl stats, trim, timeline, and the
test hooks that put real blocks and simulated pressure on a cpu device."""
import json
import os
import socket
import time

import harness
from harness import Daemon, DaemonTest

MiB = 1 << 20


class PoolOverSocket(DaemonTest):
    conf = "[cpu]\ncapacity = 1G\n[pool]\ntimeline_events = 4096\n"
    test_hooks = True

    def pool(self, dev="cpu0"):
        st = self.d.ctl_json("stats", "-d", dev)
        self.assertEqual(len(st["pools"]), 1)
        return st["pools"][0]

    def test_stats_json_shape_and_counts(self):
        p = self.pool()
        self.assertEqual(p["device"], "cpu0")
        self.assertEqual(p["device_total"], 1 << 30)
        self.assertEqual(p["cap"], 1 << 30)
        self.assertEqual(p["allocated_bytes"]["all"]["current"], 0)
        self.d.ctl("test-alloc", "-d", "cpu0", "--tag", "activations", "--job", "7", "100M")
        self.d.ctl("test-alloc", "-d", "cpu0", "--tag", "params", "--job", "7", "3000")
        self.d.ctl("test-alloc", "-d", "cpu0", "--tag", "params", "--job", "8", "1M")
        p = self.pool()
        a = p["allocated_bytes"]
        # 3000 B rounds to 3072; 100M and 1M are multiples of 512 already.
        self.assertEqual(a["all"]["current"], 100 * MiB + 3072 + MiB)
        self.assertEqual(a["small"]["current"], 3072 + MiB)
        self.assertEqual(a["large"]["current"], 100 * MiB)
        self.assertEqual(p["requested_bytes"]["all"]["current"], 100 * MiB + 3000 + MiB)
        self.assertEqual(p["allocations"]["all"]["current"], 3)
        self.assertEqual(p["tags"]["activations"]["current"], 100 * MiB)
        self.assertEqual(p["tags"]["params"]["current"], 3072 + MiB)
        jobs = {j["job"]: j for j in p["jobs"]}
        self.assertEqual(jobs[7]["allocated"], 100 * MiB + 3072)
        self.assertEqual(jobs[7]["tags"], {"params": {"current": 3072, "peak": 3072},
                                           "activations": {"current": 100 * MiB, "peak": 100 * MiB}})
        self.assertEqual(jobs[8]["allocated"], MiB)
        self.assertGreaterEqual(p["reserved_bytes"]["all"]["current"], a["all"]["current"])
        self.assertGreaterEqual(p["device_allocs"], 2)
        # The table form names the same figures.
        out = self.d.ctl("stats", "-d", "cpu0").stdout
        self.assertIn("Allocated memory", out)
        self.assertIn("Reserved memory", out)
        self.assertIn("activations 100M", out)

    def test_trim_returns_cache_to_device(self):
        self.d.ctl("test-alloc", "-d", "cpu0", "--tag", "activations", "200M")
        self.d.ctl("test-alloc", "-d", "cpu0", "--free-all")
        p = self.pool()
        self.assertEqual(p["allocated_bytes"]["all"]["current"], 0)
        cached = p["reserved_bytes"]["all"]["current"]
        self.assertGreaterEqual(cached, 200 * MiB)
        self.assertEqual(p["device_free"], (1 << 30) - cached)
        r = self.d.ctl_json("trim", "-d", "cpu0")["results"][0]
        self.assertEqual(r["device"], "cpu0")
        self.assertEqual(r["bytes"], cached)
        self.assertEqual(r["reserved_after"], 0)
        p = self.pool()
        self.assertEqual(p["reserved_bytes"]["all"]["current"], 0)
        self.assertEqual(p["device_free"], 1 << 30)
        self.assertGreaterEqual(p["trims"], 1)
        self.assertEqual(p["trimmed_bytes"], cached)
        text = self.d.ctl("trim").stdout
        self.assertIn("cpu0: released 0", text)

    def test_oom_report_and_pressure(self):
        # 100M sits in the cache; another "process" then takes 850M of the 1G.
        self.d.ctl("test-alloc", "-d", "cpu0", "--tag", "activations", "100M")
        self.d.ctl("test-alloc", "-d", "cpu0", "--free-all")
        self.d.ctl("test-pressure", "-d", "cpu0", "850M")
        # 200M fits neither the cache nor the device: the pool releases its
        # cache, retries once, and reports the OOM with the figures.
        r = self.d.ctl("test-alloc", "-d", "cpu0", "--tag", "activations", "--job", "4", "200M", check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("200", r.stderr)
        p = self.pool()
        self.assertEqual(p["ooms"], 1)
        self.assertEqual(p["alloc_retries"], 1)
        self.assertEqual(p["reserved_bytes"]["all"]["current"], 0)
        self.assertEqual(p["device_free"], (1 << 30) - 850 * MiB)
        # When the other process goes away, the same request fits.
        self.d.ctl("test-pressure", "-d", "cpu0", "0")
        self.d.ctl("test-alloc", "-d", "cpu0", "--tag", "activations", "200M")

    def test_timeline_is_perfetto_json(self):
        for i in range(5):
            self.d.ctl("test-alloc", "-d", "cpu0", "--tag", "workspace", "--job", "3", "%dM" % (i + 1))
        self.d.ctl("test-alloc", "-d", "cpu0", "--free-all")
        self.d.ctl("trim")
        self.d.ctl("test-alloc", "-d", "cpu0", "--tag", "params", "--job", "5", "2M")  # alive at the export
        out = os.path.join(self.d.dir, "trace.json")
        r = self.d.ctl("timeline", "-d", "cpu0", "-o", out)
        self.assertIn("open it in ui.perfetto.dev", r.stderr)
        with open(out) as f:
            trace = json.load(f)
        events = trace["traceEvents"]
        names = [e.get("name", "") for e in events]
        self.assertGreaterEqual(sum(1 for e in events if e.get("ph") == "C"), 2, "no counter tracks")
        for k in ("segment_map", "segment_unmap", "trim"):
            self.assertIn(k, names)
        # Every block's alloc and free are one slice: no lone instants.
        self.assertNotIn("alloc", names)
        self.assertNotIn("free", names)
        # Timestamps are microseconds, never decreasing.
        ts = [e["ts"] for e in events if e.get("ph") != "M"]
        self.assertEqual(ts, sorted(ts))
        # Each event of the ring is one entry, in order ("b" for an alloc,
        # "e" for its free); a slice's id is its alloc's number.
        self.assertEqual(trace["otherData"]["events_dropped"], 0)
        ring = [e for e in events if e.get("ph") not in ("M", "C") and not e.get("args", {}).get("alive")]
        self.assertEqual(len(ring), trace["otherData"]["events_recorded"])
        begins = {}
        for k, e in enumerate(ring):
            if e["ph"] == "b":
                self.assertEqual((e["id"], e["cat"]), (k, "block"))
                begins[e["id"]] = e
        slices = [(begins[e["id"]]["name"], begins[e["id"]]["args"]["bytes"], begins[e["id"]]["ts"] <= e["ts"])
                  for e in ring if e["ph"] == "e" and e["name"] == begins[e["id"]]["name"]]
        self.assertEqual(slices, [("job 3", (i + 1) * MiB, True) for i in range(5)])
        self.assertEqual([(b["args"]["tag"], b["args"]["job"]) for b in begins.values()],
                         [("workspace", 3)] * 5 + [("params", 5)])
        # The block still alive ends at the export, marked so, last.
        alive = [e for e in events if e.get("args", {}).get("alive")]
        self.assertEqual([(e["ph"], e["name"], e["id"]) for e in alive], [("e", "job 5", max(begins))])
        self.assertEqual(events[-1], alive[0])

    def test_full_timeline_ring(self):
        # A daemon up for a while has a full ring (65,536 events by default):
        # its JSON, some 20 MB, is far more than a connection may have
        # queued, and is still sent whole, a part at a time.
        d = Daemon("[cpu]\ncapacity = 1G\n", test_hooks=True)
        try:
            alloc = harness.field_bytes(1, b"cpu0") + harness.field_varint(2, 1024)
            req = harness.frame(harness.field_varint(1, harness.PROTOCOL_VERSION) + harness.field_bytes(15, alloc))
            s = harness.connect(d.sock, timeout=60)
            for _ in range(36):  # 36,000 allocations, then as many frees
                s.sendall(req * 1000)
                for _ in range(1000):
                    self.assertIsNotNone(harness.recv_frame(s))
            s.close()
            d.ctl("test-alloc", "-d", "cpu0", "--free-all")
            out = os.path.join(d.dir, "trace.json")
            r = d.ctl("timeline", "-d", "cpu0", "-o", out, check=False)
            self.assertEqual(r.returncode, 0, r.stderr + d.read_log())
            self.assertGreater(os.path.getsize(out), 16 << 20)
            with open(out) as f:
                events = json.load(f)["traceEvents"]
            self.assertGreaterEqual(sum(1 for e in events if e.get("ph") == "b"), 20000)
            self.assertNotIn("not reading", d.read_log())
            # Clients that ask and do not read hold a copy of the ring each
            # (64 bytes an event), not the JSON it renders to: the answer
            # is sent as they take it.
            tl = harness.frame(harness.field_varint(1, harness.PROTOCOL_VERSION) +
                               harness.field_bytes(13, harness.field_bytes(1, b"cpu0")))
            before = d.rss_kb()
            idle = []
            for _ in range(8):
                c = harness.connect(d.sock, timeout=60)
                c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                c.sendall(tl)
                idle.append(c)
            time.sleep(1.0)
            grown = d.rss_kb() - before
            if not harness.SANITIZED:
                self.assertLess(grown, 64 << 10, "%d KiB for 8 idle timeline readers" % grown)
            # One of them, reading late, still gets the whole trace.
            chunks = []
            while True:
                resp = harness.parse_fields(harness.recv_frame(idle[0]))
                tr = harness.parse_fields(resp[13][0])
                chunks.append(tr.get(2, [b""])[0])
                if tr.get(3, [0])[0]:
                    break
            trace = json.loads(b"".join(chunks))
            self.assertGreaterEqual(sum(1 for e in trace["traceEvents"] if e.get("ph") == "b"), 20000)
            for c in idle:
                c.close()
            self.assertEqual(d.ctl("status").returncode, 0)
        finally:
            d.cleanup()

    def test_test_hooks_refused_without_flag(self):
        d = Daemon("")
        try:
            r = d.ctl("test-pressure", "-d", "cpu0", "1M", check=False)
            self.assertEqual(r.returncode, 1)
            self.assertIn("--test-hooks", r.stderr)
            r = d.ctl("test-alloc", "-d", "cpu0", "1M", check=False)
            self.assertEqual(r.returncode, 1)
        finally:
            d.cleanup()

    def test_reset_peaks(self):
        self.d.ctl("test-alloc", "-d", "cpu0", "64M")
        self.d.ctl("test-alloc", "-d", "cpu0", "--free-all")
        p = self.pool()
        self.assertGreaterEqual(p["allocated_bytes"]["all"]["peak"], 64 * MiB)
        st = self.d.ctl_json("stats", "-d", "cpu0", "--reset-peaks")
        self.assertGreaterEqual(st["pools"][0]["allocated_bytes"]["all"]["peak"], 64 * MiB)
        self.assertEqual(self.pool()["allocated_bytes"]["all"]["peak"], 0)


class LowWatermark(DaemonTest):
    # The daemon's 1 s timer runs the pool's low-watermark policy on idle devices.
    conf = "[cpu]\ncapacity = 1G\n[pool]\nlow_watermark = 512M\n"
    test_hooks = True

    def test_external_pressure_trims_cache(self):
        self.d.ctl("test-alloc", "-d", "cpu0", "300M")
        self.d.ctl("test-alloc", "-d", "cpu0", "--free-all")
        cached = self.d.ctl_json("stats")["pools"][0]["reserved_bytes"]["all"]["current"]
        self.assertGreaterEqual(cached, 300 * MiB)
        # Free is 1G - cached > 512M; another process takes 400M -> under the watermark.
        self.d.ctl("test-pressure", "-d", "cpu0", "400M")
        deadline = time.time() + 10
        while time.time() < deadline:
            p = self.d.ctl_json("stats")["pools"][0]
            if p["reserved_bytes"]["all"]["current"] == 0:
                break
            time.sleep(0.2)
        self.assertEqual(p["reserved_bytes"]["all"]["current"], 0)
        self.assertGreaterEqual(p["trims"], 1)


if __name__ == "__main__":
    harness.main()
