"""Program jobs on gradd's pool: two processes that link libgradd-alloc
(tests/alloc/alloc_standin, standing in for PyTorch programs) run as
program jobs under one daemon on one simulated device.  What a user of a
shared device relies on, checked with exact figures:

- the daemon sees each program's pool live, through its page, in
  `gradctl stats`, `status`, `metrics` and `timeline`;
- [memory] limit is the program's budget: an allocation past it fails
  with a message naming the budget;
- before a program's allocation fails for want of device memory, gradd
  has the other jobs on the device give back their caches and retries:
  programs and engine allocations alike, in both directions;
- [pool] idle_trim and `gradctl trim` reach a program's cache;
- [program] allocator = pytorch leaves the program alone.
"""
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import unittest

import harness

STANDIN = os.environ.get("ALLOC_STANDIN", "")
MiB = 1 << 20
PY = shutil.which("python3") or sys.executable

# What a program job is given for the allocator, as it sees it.
PROBE = r"""
import os
for k in ("GRADD_ALLOC_LIB", "GRADD_POOL_FD", "GRADD_POOL_EVENTFD", "GRADD_ALLOC_BACKEND",
          "GRADD_ALLOC_CPU_CAPACITY", "GRADD_ALLOC_GC_THRESHOLD", "GRADD_ALLOC_LOW_WATERMARK", "PYTHONPATH"):
    print("env", k, repr(os.environ.get(k)))
for fd in (3, 4):
    try:
        print("fd", fd, os.readlink("/proc/self/fd/%d" % fd))
    except OSError as e:
        print("fd", fd, "none")
"""


# A PyTorch program on the simulated device: gradd's shim installs the
# library at `import torch` (test mode: there is no CUDA), the program
# allocates through it, and reports what torch.cuda's functions say; then
# waits for the test to look at the daemon's side.
TORCH_PROG = r"""
import os, sys, time
import torch
from gradd import _alloc
assert _alloc.installed, "the shim did not install the allocator"
p = _alloc.lib.gradd_alloc(24 << 20, 0, None)
assert p, _alloc.lib.gradd_alloc_last_error()
print("allocated", torch.cuda.memory_allocated(), "stats", torch.cuda.memory_stats()["allocated_bytes.all.current"],
      flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
_alloc.lib.gradd_free(p, 24 << 20, 0, None)
print("freed", torch.cuda.memory_allocated(), flush=True)
"""
DEBIAN_PY = "/usr/bin/python3"


def debian_torch():
    try:
        return subprocess.run([DEBIAN_PY, "-c", "import torch"], capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


class StandIn:
    """One stand-in program job, driven through a FIFO; its answers are
    read from a file it appends to."""

    def __init__(self, test, name, limit=None, extra=""):
        self.t = test
        self.fifo = os.path.join(test.dir, name + ".fifo")
        self.out = os.path.join(test.dir, name + ".out")
        os.mkfifo(self.fifo, 0o600)
        open(self.out, "w").close()
        self.seen = 0
        body = "[job]\ntype = program\ndevice = cpu0\nname = %s\n[program]\ncommand = %s %s %s\n%s" % (
            name, STANDIN, self.fifo, self.out, extra)
        if limit:
            body += "[memory]\nlimit = %s\n" % limit
        path = os.path.join(test.dir, name + ".cfg")
        with open(path, "w") as f:
            f.write(body)
        r = test.d.ctl("submit", path)
        self.id = int(r.stdout.split()[1])
        harness.wait_job(test.d, self.id, ("running",), timeout=30)

    def cmd(self, line, timeout=15):
        deadline = time.time() + timeout
        while True:
            try:
                fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError:  # ENXIO until the program has opened it
                if time.time() > deadline:
                    raise AssertionError("job %d never opened its FIFO:\n%s" % (self.id, self.t.d.read_log()))
                time.sleep(0.01)
        os.write(fd, (line + "\n").encode())
        os.close(fd)
        while time.time() < deadline:
            with open(self.out) as f:
                lines = f.read().splitlines()
            if len(lines) > self.seen:
                self.seen += 1
                return lines[self.seen - 1]
            time.sleep(0.005)
        raise AssertionError("job %d did not answer %r:\n%s" % (self.id, line, self.t.d.ctl("logs", str(self.id)).stdout))

    def quit(self):
        fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.write(fd, b"quit\n")
        os.close(fd)
        info = harness.wait_job(self.t.d, self.id, ("completed", "failed"), timeout=30)
        self.t.assertEqual(info["state"], "completed", info)


def program_pools(d):
    """{job id: PoolStats JSON} of the program pools `gradctl stats` shows."""
    return {p["job"]: p for p in d.ctl_json("stats")["pools"] if p["job"]}


def wait_pool(test, jid, check, timeout=5):
    """The program's pool once check(pool) holds (the page lags by ~2 ms)."""
    deadline = time.time() + timeout
    while True:
        p = program_pools(test.d).get(jid)
        if p and check(p):
            return p
        if time.time() > deadline:
            test.fail("job %d's pool never passed the check: %s" % (jid, json.dumps(p, indent=1)))
        time.sleep(0.02)


def shared_seen(test, held, timeout=10):
    """Wait until the daemon's copy of cpu0 counts `held` bytes of the
    programs' as taken.  Its peers thread sets that and each program's
    shared word in the same tick, so B's copy then knows as well."""
    deadline = time.time() + timeout
    while True:
        dev = [x for x in test.d.ctl_json("status")["devices"] if x["id"] == "cpu0"][0]
        if dev["mem_total"] - dev["mem_free"] >= held:
            time.sleep(0.05)
            return
        if time.time() > deadline:
            test.fail("cpu0 never counted %d bytes of the programs': %s" % (held, dev))
        time.sleep(0.02)


def cur(p, key):
    return p[key]["all"]["current"]


@unittest.skipUnless(STANDIN and os.access(STANDIN, os.X_OK), "ALLOC_STANDIN is not built")
class ProgramPools(harness.DaemonTest):
    conf = ("[daemon]\nclient_timeout = 60s\nmax_jobs_per_device = 4\n"
            "[cpu]\ncapacity = 96M\n[pool]\nidle_trim = 0\n")
    test_hooks = True

    def setUp(self):
        super().setUp()
        self.dir = tempfile.mkdtemp(prefix="gradd-ppool-")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)

    def test_live_stats_everywhere(self):
        a = StandIn(self, "a")
        self.assertEqual(a.cmd("hold %d" % (32 * MiB)), "ok")
        p = wait_pool(self, a.id, lambda p: cur(p, "allocated_bytes") == 32 * MiB)
        self.assertEqual(p["device"], "cpu0")
        self.assertGreaterEqual(cur(p, "reserved_bytes"), 32 * MiB)
        self.assertEqual(p["allocations"]["all"]["current"], 1)
        self.assertEqual(p["ooms"], 0)
        # The page's pid is the program's: the job's process group leader.
        info = self.d.ctl_json("status", str(a.id))
        self.assertEqual(info["mem_allocated"], 32 * MiB)
        with open("/proc/%d/stat" % p["pid"]) as f:
            self.assertEqual(int(f.read().rsplit(")", 1)[1].split()[3]), p["pid"])  # its own group
        # What the program's own getters say agrees with the daemon.
        self.assertEqual(a.cmd("stats"), "ok allocated=%d reserved=%d peak=%d"
                         % (32 * MiB, cur(p, "reserved_bytes"), 32 * MiB))
        # The device's figures count the program's pool; its process is
        # listed under its job.
        st = self.d.ctl_json("status")
        dev = [x for x in st["devices"] if x["id"] == "cpu0"][0]
        self.assertEqual(dev["pool_allocated"], 32 * MiB)
        procs = {x["pid"]: x for x in dev["processes"]}
        self.assertIn(p["pid"], procs)
        self.assertEqual(procs[p["pid"]]["jobs"], [a.id])
        self.assertEqual(procs[p["pid"]]["used_bytes"], cur(p, "reserved_bytes"))
        text = self.d.ctl("stats").stdout
        self.assertIn("program job %d (pid %d): its own pool" % (a.id, p["pid"]), text)
        m = self.d.ctl("metrics").stdout
        self.assertIn('gradd_program_pool_allocated_bytes{device="cpu0",job="%d"} %d\n' % (a.id, 32 * MiB), m)
        # Its job's memory by tag is its own pool's: the shim tags it all "other".
        self.assertRegex(m, r'gradd_job_memory_bytes\{job="%d",[^}]*,device="cpu0",tag="other"\} %d\n'
                         % (a.id, 32 * MiB))
        # The timeline has the program's segment on its job's track.
        self.assertEqual(a.cmd("freeall"), "ok")
        wait_pool(self, a.id, lambda p: cur(p, "allocated_bytes") == 0)
        # The daemon's peers thread marks it at its next tick (100 ms).
        trace = os.path.join(self.dir, "trace.json")
        deadline = time.time() + 10
        while True:
            self.d.ctl("timeline", "-d", "cpu0", "-o", trace)
            with open(trace) as f:
                tl = json.load(f)
            maps = [e for e in tl["traceEvents"] if e.get("name") == "segment_map"
                    and e.get("args", {}).get("job") == a.id]
            if maps or time.time() > deadline:
                break
            time.sleep(0.05)
        self.assertTrue(maps, "no segment_map event for job %d in the timeline" % a.id)
        a.quit()
        # Gone with the program.
        self.assertNotIn(a.id, program_pools(self.d))

    def test_budget(self):
        c = StandIn(self, "c", limit="16M")
        r = c.cmd("hold %d" % (32 * MiB))
        self.assertTrue(r.startswith("oom CUDA out of memory. Tried to allocate 32.0M on device 0, over the job's "
                                     "budget ([memory] limit) of 16.0M"), r)
        self.assertEqual(c.cmd("hold %d" % (8 * MiB)), "ok")
        p = wait_pool(self, c.id, lambda p: p["ooms"] == 1 and cur(p, "allocated_bytes") == 8 * MiB)
        self.assertEqual(p["reclaims"], 0)  # no other job's cache can help a budget
        c.quit()

    def test_reclaim_between_programs(self):
        a = StandIn(self, "a")
        b = StandIn(self, "b")
        # A caches 64M of the 96M device and goes quiet.
        self.assertEqual(a.cmd("hold %d" % (64 * MiB)), "ok")
        self.assertEqual(a.cmd("freeall"), "ok")
        wait_pool(self, a.id, lambda p: cur(p, "allocated_bytes") == 0 and cur(p, "reserved_bytes") == 64 * MiB)
        shared_seen(self, 64 * MiB)  # and B's copy of the device with it
        # B needs 64M: only A's cache can give it.
        self.assertEqual(b.cmd("hold %d" % (64 * MiB)), "ok")
        pa = wait_pool(self, a.id, lambda p: cur(p, "reserved_bytes") == 0)
        self.assertEqual(pa["trims"], 1)
        self.assertEqual(pa["trimmed_bytes"], 64 * MiB)
        pb = wait_pool(self, b.id, lambda p: cur(p, "allocated_bytes") == 64 * MiB)
        self.assertEqual(pb["alloc_retries"], 1)
        self.assertEqual(pb["ooms"], 0)
        self.assertEqual(pb["reclaims"], 1)
        # Nothing cached anywhere now: 64M more does not fit, and is an OOM.
        r = b.cmd("hold %d" % (64 * MiB))
        self.assertTrue(r.startswith("oom CUDA out of memory. Tried to allocate 64.0M"), r)
        wait_pool(self, b.id, lambda p: p["ooms"] == 1)
        # A's 32M now fits beside B's 64M only once B's cache is empty too:
        # B holds 64M live, so A gets 32M of what is left.
        self.assertEqual(a.cmd("hold %d" % (32 * MiB)), "ok")
        a.quit()
        b.quit()

    def test_engine_allocation_reclaims_from_a_program(self):
        a = StandIn(self, "a")
        self.assertEqual(a.cmd("hold %d" % (64 * MiB)), "ok")
        self.assertEqual(a.cmd("freeall"), "ok")
        wait_pool(self, a.id, lambda p: cur(p, "reserved_bytes") == 64 * MiB and cur(p, "allocated_bytes") == 0)
        shared_seen(self, 64 * MiB)
        # The daemon's own pool (an engine job's allocation, here the test
        # hook's) needs 64M of the 96M: A gives its cache back.
        r = self.d.ctl("test-alloc", "-d", "cpu0", "64M", check=False)
        self.assertEqual(r.returncode, 0, r.stderr + self.d.read_log())
        wait_pool(self, a.id, lambda p: cur(p, "reserved_bytes") == 0 and p["trims"] == 1)
        own = [p for p in self.d.ctl_json("stats")["pools"] if not p["job"]][0]
        self.assertEqual(own["alloc_retries"], 1)
        self.assertEqual(own["ooms"], 0)
        self.d.ctl("test-alloc", "-d", "cpu0", "--free-all")
        a.quit()

    def test_program_allocation_reclaims_from_the_engine(self):
        # The daemon's own pool (an engine job's allocations, here the test
        # hook's) caches 64M of the 96M device.
        r = self.d.ctl("test-alloc", "-d", "cpu0", "64M", check=False)
        self.assertEqual(r.returncode, 0, r.stderr + self.d.read_log())
        self.d.ctl("test-alloc", "-d", "cpu0", "--free-all")
        own = [p for p in self.d.ctl_json("stats")["pools"] if not p["job"]][0]
        self.assertEqual((cur(own, "allocated_bytes"), cur(own, "reserved_bytes")), (0, 64 * MiB))
        # A program that needs 64M as it starts: it sees the daemon's 64M
        # taken from its first allocation on, and only the daemon's cache
        # can give it room.
        cmds, out = os.path.join(self.dir, "cmds"), os.path.join(self.dir, "out")
        with open(cmds, "w") as f:
            f.write("hold %d\nstats\n" % (64 * MiB))
        path = os.path.join(self.dir, "at-once.cfg")
        with open(path, "w") as f:
            f.write("[job]\ntype = program\ndevice = cpu0\n[program]\ncommand = %s %s %s\n" % (STANDIN, cmds, out))
        jid = int(self.d.ctl("submit", path).stdout.split()[1])
        info = harness.wait_job(self.d, jid, ("completed", "failed"), timeout=30)
        self.assertEqual(info["state"], "completed", info)
        with open(out) as f:
            self.assertEqual(f.read().splitlines(), ["ok", "ok allocated=%d reserved=%d peak=%d"
                                                     % (64 * MiB, 64 * MiB, 64 * MiB)])
        own = [p for p in self.d.ctl_json("stats")["pools"] if not p["job"]][0]
        self.assertEqual((cur(own, "reserved_bytes"), own["trims"], own["trimmed_bytes"]), (0, 1, 64 * MiB))

    def test_gradctl_trim_reaches_programs(self):
        a = StandIn(self, "a")
        self.assertEqual(a.cmd("hold %d" % (40 * MiB)), "ok")
        self.assertEqual(a.cmd("freeall"), "ok")
        wait_pool(self, a.id, lambda p: cur(p, "reserved_bytes") == 40 * MiB and cur(p, "allocated_bytes") == 0)
        r = self.d.ctl_json("trim")
        res = [x for x in r["results"] if x["device"] == "cpu0"][0]
        self.assertGreaterEqual(res["bytes"], 40 * MiB)
        self.assertEqual(res["reserved_after"], 0)
        p = wait_pool(self, a.id, lambda p: cur(p, "reserved_bytes") == 0)
        self.assertEqual(p["trims"], 1)
        a.quit()

    def test_what_the_program_is_given(self):
        probe = os.path.join(self.dir, "probe.py")
        with open(probe, "w") as f:
            f.write(PROBE)
        for allocator in ("gradd", "pytorch"):
            path = os.path.join(self.dir, allocator + ".cfg")
            with open(path, "w") as f:
                f.write("[job]\ntype = program\ndevice = cpu0\n[program]\ncommand = %s %s\nallocator = %s\n"
                        "env = PYTHONPATH=/opt/mine\n" % (PY, probe, allocator))
            jid = int(self.d.ctl("submit", path).stdout.split()[1])
            info = harness.wait_job(self.d, jid, ("completed", "failed"))
            self.assertEqual(info["state"], "completed", info)
            out = self.d.ctl("logs", str(jid)).stdout
            if allocator == "gradd":
                lib = re.search(r"env GRADD_ALLOC_LIB '([^']+)'", out)
                self.assertTrue(lib, out)
                self.assertTrue(os.path.isabs(lib.group(1)) and lib.group(1).endswith("/libgradd-alloc.so"))
                self.assertIn("env GRADD_POOL_FD '3'\n", out)
                self.assertIn("env GRADD_POOL_EVENTFD '4'\n", out)
                self.assertIn("env GRADD_ALLOC_BACKEND 'cpu'\n", out)
                self.assertIn("env GRADD_ALLOC_CPU_CAPACITY '%d'\n" % (96 * MiB), out)
                # No [pool] gc_threshold or low_watermark here: the library's
                # defaults (off) stand (ProgramPressure sets both).
                self.assertIn("env GRADD_ALLOC_GC_THRESHOLD None\n", out)
                self.assertIn("env GRADD_ALLOC_LOW_WATERMARK None\n", out)
                self.assertIn("fd 3 /memfd:gradd-pool (deleted)\n", out)
                self.assertIn("fd 4 anon_inode:[eventfd]\n", out)
                self.assertIn("allocator: gradd's pool on cpu0", out)
            else:
                self.assertIn("env GRADD_ALLOC_LIB None\n", out)
                self.assertIn("env GRADD_POOL_FD None\n", out)
                self.assertIn("fd 3 none\n", out)
                self.assertIn("allocator: the program's own ([program] allocator = pytorch)", out)
            # The job's own PYTHONPATH stays, after gradd's folder when
            # there is one.
            pp = re.search(r"env PYTHONPATH '([^']*)'", out).group(1)
            self.assertTrue(pp == "/opt/mine" or pp.endswith("/python:/opt/mine"), pp)

    @unittest.skipUnless(debian_torch(), "no torch for /usr/bin/python3 (python3-torch, scripts/deps.sh)")
    def test_python_program_through_the_shim(self):
        prog = os.path.join(self.dir, "torch_prog.py")
        go = os.path.join(self.dir, "go")
        with open(prog, "w") as f:
            f.write(TORCH_PROG)
        path = os.path.join(self.dir, "torch.cfg")
        env = "env = %s\n" % harness.program_env()
        with open(path, "w") as f:
            f.write("[job]\ntype = program\ndevice = cpu0\n[program]\ncommand = %s %s %s\n%s"
                    % (DEBIAN_PY, prog, go, env))
        jid = int(self.d.ctl("submit", path).stdout.split()[1])
        # The daemon sees what torch sees, while the program runs.
        p = wait_pool(self, jid, lambda p: cur(p, "allocated_bytes") == 24 * MiB, timeout=60)
        self.assertEqual(p["allocations"]["all"]["current"], 1)
        self.assertEqual(self.d.ctl_json("status", str(jid))["mem_allocated"], 24 * MiB)
        open(go, "w").close()
        info = harness.wait_job(self.d, jid, ("completed", "failed"), timeout=60)
        out = self.d.ctl("logs", str(jid)).stdout
        self.assertEqual(info["state"], "completed", out)
        self.assertIn("allocated %d stats %d\n" % (24 * MiB, 24 * MiB), out)
        self.assertIn("freed 0\n", out)
        self.assertNotIn("gradd:", out.replace("allocator: gradd's pool", ""))

    def test_reserved_env_refused(self):
        path = os.path.join(self.dir, "bad.cfg")
        with open(path, "w") as f:
            f.write("[job]\ntype = program\n[program]\ncommand = /bin/true\nenv = GRADD_POOL_FD=7\n")
        r = self.d.ctl("submit", path, check=False)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("%s:5: [program] env: GRADD_POOL_FD is set by gradd for every program job" % path, r.stderr)


@unittest.skipUnless(STANDIN and os.access(STANDIN, os.X_OK), "ALLOC_STANDIN is not built")
class ProgramIdleTrim(harness.DaemonTest):
    conf = "[daemon]\nclient_timeout = 60s\n[cpu]\ncapacity = 96M\n[pool]\nidle_trim = 1s\n"

    def test_idle_program_gives_its_cache_back(self):
        self.dir = tempfile.mkdtemp(prefix="gradd-ppool-")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        a = StandIn(self, "a")
        self.assertEqual(a.cmd("hold %d" % (32 * MiB)), "ok")
        self.assertEqual(a.cmd("freeall"), "ok")
        t0 = time.time()
        p = wait_pool(self, a.id, lambda p: cur(p, "reserved_bytes") == 0, timeout=10)
        took = time.time() - t0
        self.assertEqual(p["idle_trims"], 1)
        self.assertEqual(p["idle_trimmed_bytes"], 32 * MiB)
        # Not before idle_trim, and within a few ticks after it.
        self.assertGreaterEqual(took, 0.9)
        self.assertLess(took, 5)
        # Still running and still allocating: a new spell, a new trim.
        self.assertEqual(a.cmd("hold %d" % (8 * MiB)), "ok")
        self.assertEqual(a.cmd("freeall"), "ok")
        p = wait_pool(self, a.id, lambda p: p["idle_trims"] == 2, timeout=10)
        a.quit()


@unittest.skipUnless(STANDIN and os.access(STANDIN, os.X_OK), "ALLOC_STANDIN is not built")
class ProgramPressure(harness.DaemonTest):
    """[pool] gc_threshold and low_watermark apply to a program's pool,
    and a neighbour's growth counts against the watermark."""
    conf = ("[daemon]\nclient_timeout = 60s\nmax_jobs_per_device = 4\n[cpu]\ncapacity = 96M\n"
            "[pool]\nidle_trim = 0\nlow_watermark = 24M\ngc_threshold = 0.9\n")

    def setUp(self):
        super().setUp()
        self.dir = tempfile.mkdtemp(prefix="gradd-ppool-")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)

    def test_policies_given(self):
        probe = os.path.join(self.dir, "probe.py")
        with open(probe, "w") as f:
            f.write(PROBE)
        path = os.path.join(self.dir, "probe.cfg")
        with open(path, "w") as f:
            f.write("[job]\ntype = program\ndevice = cpu0\n[program]\ncommand = %s %s\n" % (PY, probe))
        jid = int(self.d.ctl("submit", path).stdout.split()[1])
        info = harness.wait_job(self.d, jid, ("completed", "failed"))
        out = self.d.ctl("logs", str(jid)).stdout
        self.assertEqual(info["state"], "completed", out)
        self.assertIn("env GRADD_ALLOC_GC_THRESHOLD '0.9'\n", out)
        self.assertIn("env GRADD_ALLOC_LOW_WATERMARK '%d'\n" % (24 * MiB), out)

    def test_neighbour_growth_trims_a_programs_cache(self):
        a = StandIn(self, "a")
        b = StandIn(self, "b")
        # A caches 64M of 96M: 32M free is above the watermark, and stays.
        self.assertEqual(a.cmd("hold %d" % (64 * MiB)), "ok")
        self.assertEqual(a.cmd("freeall"), "ok")
        wait_pool(self, a.id, lambda p: cur(p, "allocated_bytes") == 0 and cur(p, "reserved_bytes") == 64 * MiB)
        time.sleep(1.2)  # a policy round of an idle program (1 s)
        self.assertEqual(program_pools(self.d)[a.id]["trims"], 0)
        # B takes 16M: 16M free is under 24M, and A gives its cache back
        # without being asked (no reclaim: B's allocation fitted).
        self.assertEqual(b.cmd("hold %d" % (16 * MiB)), "ok")
        pa = wait_pool(self, a.id, lambda p: cur(p, "reserved_bytes") == 0, timeout=10)
        self.assertEqual(pa["trims"], 1)
        self.assertEqual(pa["trimmed_bytes"], 64 * MiB)
        pb = wait_pool(self, b.id, lambda p: cur(p, "allocated_bytes") == 16 * MiB)
        self.assertEqual(pb["reclaims"], 0)
        self.assertEqual(pb["ooms"], 0)
        a.quit()
        b.quit()


if __name__ == "__main__":
    harness.main()
