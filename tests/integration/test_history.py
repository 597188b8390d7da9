"""Accounting under a real gradd: a finished job keeps its peak memory by tag
and its device in `status`; each job end is one line of
STATE_DIR/accounting.jsonl, shown by `gradctl history` newest first with
exact fields, filtered by user, state and time, summed per user; the
records survive `gradctl rm` and a daemon restart; a damaged line is
skipped with a warning naming the file and line; the file rotates at
[daemon] max_accounting, keeping one old file."""
import json
import os
import pwd
import re
import shutil
import stat
import tempfile
import unittest

import harness
import test_hostile_disk

# The hostile-disk tests' tiny GPT: a few steps take well under a second.
JOB = test_hostile_disk.JOB


class History(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="gradd-hist-")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        os.chmod(self.dir, 0o755)
        self.train = os.path.join(self.dir, "corpus.txt")
        harness.write_corpus(self.train)
        self.state = os.path.join(self.dir, "state")
        self.acct = os.path.join(self.state, "accounting.jsonl")
        self.d = None

    def tearDown(self):
        if self.d:
            code = self.d.stop()
            log = self.d.read_log()
            self.d.cleanup()
            self.assertEqual(code, 0, log)

    def start(self, conf="[daemon]\nmax_jobs_per_device = 1\n"):
        if self.d:
            self.assertEqual(self.d.stop(), 0, self.d.read_log())
            self.d.cleanup()
        self.d = harness.Daemon(conf, args=("--state-dir", self.state))
        return self.d

    def engine(self, name):
        path = os.path.join(self.dir, name + ".cfg")
        with open(path, "w") as f:
            f.write(JOB.format(name=name, train=self.train, steps=3, out=os.path.join(self.dir, "out-" + name)))
        return path

    def program(self, name, command):
        path = os.path.join(self.dir, name + ".cfg")
        with open(path, "w") as f:
            f.write("[job]\nname = %s\ntype = program\n[program]\ncommand = %s\n" % (name, command))
        return path

    def submit(self, path):
        return int(self.d.ctl("submit", path).stdout.split()[1])

    def history(self, *args):
        return self.d.ctl_json("history", *args)

    def test_records_filters_summary_rm_restart(self):
        d = self.start()
        ok = self.submit(self.engine("ok"))
        harness.wait_job(d, ok, ("completed",))
        bad = self.submit(self.program("bad", "/bin/sh -c 'exit 3'"))
        harness.wait_job(d, bad, ("failed",))
        sleeper = self.submit(self.program("sleeper", "/bin/sleep 60"))
        harness.wait_job(d, sleeper, ("running",))
        waiter = self.submit(self.program("waiter", "/bin/true"))
        d.ctl("cancel", str(waiter))
        harness.wait_job(d, waiter, ("cancelled",))
        d.ctl("cancel", str(sleeper))
        harness.wait_job(d, sleeper, ("cancelled",))
        status = {i: d.ctl_json("status", str(i)) for i in (ok, bad, sleeper, waiter)}

        # A finished job keeps its device and its peak by tag.
        s = status[ok]
        self.assertEqual(s["device"], "cpu0")
        self.assertEqual(s["mem_allocated"], 0)
        self.assertGreater(s["mem_peak"], 0)
        self.assertEqual(set(s["mem_tags"]) >= {"params", "grads", "optimizer", "activations"}, True, s["mem_tags"])
        for tag, v in s["mem_tags"].items():
            self.assertEqual(v["current"], 0)
            self.assertGreater(v["peak"], 0)
            self.assertEqual(v["peak"] % 512, 0, tag)
        text = d.ctl("status", str(ok)).stdout
        self.assertRegex(text, r"memory\s+- \(peak [0-9.]+[KMG]?\)")
        self.assertRegex(text, r"\n\s+params\s+0\s+\(peak [0-9.]+[KMG]?\)")

        h = self.history()
        self.assertEqual(h["skipped"], 0)
        recs = h["records"]
        self.assertEqual([r["id"] for r in recs], [sleeper, waiter, bad, ok])
        me = os.getuid()
        for r in recs:
            st = status[r["id"]]
            self.assertEqual((r["uid"], r["user"], r["name"], r["state"], r["reason"], r["type"]),
                             (me, st["user"], st["name"], st["state"], st["reason"], st["type"]))
            self.assertEqual((r["submitted_at"], r["finished_at"], r["resumes"]),
                             (st["submitted_at"], st["finished_at"], 0))
            self.assertEqual(r["oom_recoveries"], 0)
        by = {r["id"]: r for r in recs}
        self.assertEqual(by[bad]["reason"], status[bad]["reason"])
        self.assertIn("3", by[bad]["reason"])
        # Ran: on cpu0 for finished_at - started_at; never ran: nowhere, 0.
        for i in (ok, bad, sleeper):
            r = by[i]
            self.assertEqual((r["device"], r["devices"], r["started_at"]), ("cpu0", 1, status[i]["started_at"]))
            self.assertAlmostEqual(r["elapsed_s"], r["finished_at"] - r["started_at"], places=9)
            self.assertAlmostEqual(r["device_hours"], r["elapsed_s"] / 3600, places=12)
        w = by[waiter]
        self.assertEqual((w["device"], w["devices"], w["started_at"], w["elapsed_s"], w["device_hours"]),
                         ("", 0, None, 0.0, 0.0))
        self.assertEqual((by[ok]["steps_done"], by[ok]["steps"], by[ok]["type"]), (3, 3, "engine"))
        self.assertEqual(by[ok]["mem_peak"], status[ok]["mem_peak"])
        self.assertEqual(by[ok]["mem_peak_tags"], {t: v["peak"] for t, v in status[ok]["mem_tags"].items()})

        # Filters.
        self.assertEqual(len(self.history("--user", str(me))["records"]), 4)
        self.assertEqual(len(self.history("--user", pwd.getpwuid(me).pw_name)["records"]), 4)
        # A name that is no user and has no records is a typo, said as list
        # says it; a uid with no records is an empty answer.
        r = self.d.ctl("history", "--user", "nosuchuser", check=False)
        self.assertEqual(r.returncode, 2, r.stdout)
        self.assertIn("gradctl history: no user nosuchuser, and no records of one\n", r.stderr)
        self.assertEqual(self.history("--user", "4000000")["records"], [])
        self.assertEqual([r["id"] for r in self.history("--state", "failed")["records"]], [bad])
        self.assertEqual([r["id"] for r in self.history("--state", "cancelled")["records"]], [sleeper, waiter])
        self.assertEqual([r["id"] for r in self.history("-n", "2")["records"]], [sleeper, waiter])
        self.assertEqual(len(self.history("--since", "1h")["records"]), 4)
        self.assertEqual(self.history("--until", "1h")["records"], [])
        self.assertEqual(self.history("--since", "2999-01-01")["records"], [])
        self.assertEqual(len(self.history("--since", "2000-01-01T00:00", "--until", "2999-01-01 00:00:00")
                             ["records"]), 4)
        r = d.ctl("history", "--since", "yesterday-ish", check=False)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--since: 'yesterday-ish' is not a time", r.stderr)
        r = d.ctl("history", "--state", "running", check=False)
        self.assertEqual(r.returncode, 2)
        r = d.ctl("history", "-n", "501", check=False)
        self.assertEqual((r.returncode, r.stderr.count("--limit: '501' is not a number from 1 to 500")), (2, 1))

        # The per-user summary: exact counts and sums (summed oldest first,
        # as the daemon reads the file).
        summ = self.history("--summary")
        self.assertEqual(len(summ["users"]), 1)
        u = summ["users"][0]
        dh = el = 0.0
        for r in reversed(recs):
            dh += r["device_hours"]
            el += r["elapsed_s"]
        self.assertEqual((u["uid"], u["jobs"], u["completed"], u["failed"], u["cancelled"]), (me, 4, 1, 1, 2))
        self.assertEqual((u["device_hours"], u["elapsed_s"]), (dh, el))
        self.assertEqual(self.history("--summary", "--state", "cancelled")["users"][0]["jobs"], 2)

        # The text table: a header, then one row per record, newest first.
        lines = d.ctl("history").stdout.splitlines()
        self.assertEqual(lines[0].split()[:7], ["JOB", "USER", "NAME", "TYPE", "STATE", "DEVICE", "ENDED"])
        self.assertEqual([int(l.split()[0]) for l in lines[1:]], [sleeper, waiter, bad, ok])
        lines = d.ctl("history", "--summary").stdout.splitlines()
        self.assertEqual(lines[0].split(), ["USER", "UID", "JOBS", "COMPLETED", "FAILED", "CANCELLED", "DEV-H",
                                            "ELAPSED"])
        self.assertEqual(lines[1].split()[1:6], [str(me), "4", "1", "1", "2"])
        # Columns for scripts, as list takes them.
        out = d.ctl("history", "-o", "job,state", "--noheadings").stdout.splitlines()
        self.assertEqual([l.split() for l in out], [[str(sleeper), "cancelled"], [str(waiter), "cancelled"],
                                                    [str(bad), "failed"], [str(ok), "completed"]])
        r = d.ctl("history", "-o", "job,bogus", check=False)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("bogus", r.stderr)

        # rm forgets the job, not its record; neither does a restart.
        d.ctl("rm", str(ok))
        self.assertEqual(d.ctl("status", str(ok), check=False).returncode, 1)
        self.assertEqual(self.history()["records"], recs)
        d = self.start()
        self.assertEqual(self.history()["records"], recs)
        # The kept peaks came back from the state file.
        again = d.ctl_json("status", str(bad))
        self.assertEqual((again["device"], again["mem_peak"], again["mem_tags"]),
                         ("cpu0", status[bad]["mem_peak"], status[bad]["mem_tags"]))
        # The file is the daemon's and no one else's to write or read.
        st = os.stat(self.acct)
        self.assertEqual((st.st_uid, stat.S_IMODE(st.st_mode) & 0o027), (os.geteuid(), 0))
        with open(self.acct) as f:
            self.assertEqual(len(f.readlines()), 4)

    def test_damaged_lines_and_rotation(self):
        d = self.start("[daemon]\nmax_accounting = 64K\n")
        jid = self.submit(self.program("one", "/bin/true"))
        harness.wait_job(d, jid, ("completed",))
        with open(self.acct) as f:
            line = f.read()
        rec = json.loads(line)
        self.assertEqual((rec["id"], rec["state"], rec["type"]), (jid, "completed", "program"))

        # Damage: not JSON, a wrong type, a state that is not final, a NUL.
        def with_id(i, **kw):
            r = dict(rec, id=i, **kw)
            return json.dumps(r, separators=(",", ":")) + "\n"
        with open(self.acct, "a") as f:
            f.write("{not json\n")
            f.write(with_id(1001))
            f.write(with_id(1002, uid="0"))
            f.write(with_id(1003, state="running"))
            f.write(with_id(1004)[:-2] + "\0}\n")
            f.write(with_id(1005))
        r = d.ctl("--json", "history")
        h = json.loads(r.stdout)
        self.assertEqual([x["id"] for x in h["records"]], [1005, 1001, jid])
        self.assertEqual(h["skipped"], 4)
        self.assertIn("4 damaged accounting lines skipped", r.stderr)
        log = d.read_log()
        for n, what in ((2, "not JSON"), (4, "uid: not a whole number"), (5, "state: not one of"), (6, "not JSON")):
            self.assertRegex(log, re.escape("%s:%d: %s" % (self.acct, n, what)))

        # Rotation: past 64K the file becomes .1 and a new one starts with
        # the next record; the one after the next rotation replaces .1.
        # The fillers leave less room than one of them; the next records,
        # with longer names, do not fit in it.
        size = os.path.getsize(self.acct)
        filler = with_id(2000)
        with open(self.acct, "a") as f:
            f.write(filler * ((65536 - size) // len(filler)))
        before = os.path.getsize(self.acct)
        self.assertLessEqual(before, 65536)
        jid2 = self.submit(self.program("two-" + "x" * 50, "/bin/true"))
        harness.wait_job(d, jid2, ("completed",))
        self.assertEqual(os.path.getsize(self.acct + ".1"), before)
        with open(self.acct) as f:
            self.assertEqual([json.loads(l)["id"] for l in f], [jid2])
        h = self.history("-n", "500")
        self.assertEqual(h["records"][0]["id"], jid2)
        self.assertEqual(len(h["records"]), 3 + (65536 - size) // len(filler) + 1)
        with open(self.acct, "a") as f:
            f.write(filler * ((65536 - os.path.getsize(self.acct)) // len(filler)))
        jid3 = self.submit(self.program("three-" + "x" * 50, "/bin/true"))
        harness.wait_job(d, jid3, ("completed",))
        self.assertLessEqual(os.path.getsize(self.acct + ".1"), 65536)
        with open(self.acct + ".1") as f:
            self.assertEqual(json.loads(f.readline())["id"], jid2)
        self.assertEqual([r["id"] for r in self.history("-n", "1")["records"]], [jid3])
        self.assertIn("[daemon] max_accounting", d.read_log())


if __name__ == "__main__":
    harness.main()
