"""gradctl's contract with scripts and people, against a real gradd: with
--json every failure is one JSON error object on stdout with the exit code
of the plain run, whoever found it; option values are never taken for
gradctl's own options; messages name things one way; piped watch is
quiet; logs -f follows a job to its end and --tail shows its last lines;
list's columns can be picked."""
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import shutil

import harness
from harness import GRADCTL
from test_client import JOB as GPT

PY = shutil.which("python3") or sys.executable

# Prints a numbered line every 0.2 s, ten of them: about two seconds.
PRINTER = r"""
import sys, time
for i in range(10):
    print("line", i, flush=True)
    time.sleep(0.2)
"""

class Contract(harness.DaemonTest):
    def setUp(self):
        super().setUp()
        self.tmp, self.corpus = harness.scratch_corpus(self, "gradd-cli-")

    def write(self, name, text):
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o644)
        return path

    def program(self, name, command):
        return self.write(name + ".cfg", "[job]\ntype = program\nname = %s\n[program]\ncommand = %s\n"
                          % (name, command))

    def gpt(self, name, steps=2, vocab=256):
        text = GPT.format(name=name, steps=steps).replace("vocab = 256", "vocab = %d" % vocab)
        return self.write(name + ".cfg", text.replace("dir = out", "dir = %s-out" % name))

    def submit(self, cfg):
        return int(self.d.ctl("submit", cfg).stdout.split()[1])

    def both(self, *args, sock=None, stdin=None):
        """The plain run and the --json run of the same command:
        (plain CompletedProcess, json CompletedProcess, the error object)."""
        base = [GRADCTL, "-s", sock or self.d.sock]
        plain = subprocess.run(base + list(args), capture_output=True, text=True, timeout=60, input=stdin,
                               cwd=self.tmp)
        js = subprocess.run(base + ["--json"] + list(args), capture_output=True, text=True, timeout=60,
                            input=stdin, cwd=self.tmp)
        self.assertEqual(js.returncode, plain.returncode, (args, plain.stderr, js.stdout))
        self.assertEqual(plain.stdout, "", plain.stdout)
        lines = js.stdout.splitlines()
        self.assertEqual(len(lines), 1, js.stdout)
        err = json.loads(lines[0])["error"]
        # The same message on stderr both times, with one prefix.
        self.assertEqual(js.stderr, plain.stderr)
        self.assertIn(err["message"].splitlines()[0], plain.stderr)
        return plain, js, err

    # ---- --json: one error object, whoever found the fault ------------------------

    def test_bad_job_found_by_gradctl(self):
        cfg = self.write("bad.cfg", "[job]\nname = x\nbogus = 1\n")
        plain, _, err = self.both("submit", cfg)
        self.assertEqual(plain.returncode, 2)
        self.assertEqual(err["code"], "bad_job")
        self.assertEqual((err["file"], err["line"], err["section"], err["key"]), (cfg, 3, "job", "bogus"))
        self.assertEqual(plain.stderr, "gradctl submit: %s:3: [job] bogus: unknown key\n" % cfg)
        # From standard input it is "(stdin)", not a path made up in the cwd.
        plain, _, err = self.both("submit", "-", stdin="[job]\nname = x\nbogus = 1\n")
        self.assertEqual(plain.returncode, 2)
        self.assertEqual((err["file"], err["line"], err["key"]), ("(stdin)", 3, "bogus"))
        self.assertEqual(plain.stderr, "gradctl submit: (stdin):3: [job] bogus: unknown key\n")
        # A file that cannot be read at all.
        plain, _, err = self.both("submit", os.path.join(self.tmp, "missing.cfg"))
        self.assertEqual((plain.returncode, err["code"]), (2, "bad_job"))

    def test_bad_job_found_by_the_daemon(self):
        # Well formed, so gradctl passes it; no such device on this daemon.
        text = "[job]\ntype = program\ndevice = cuda:7\n[program]\ncommand = true\n"
        cfg = self.write("nodev.cfg", text)
        plain, _, err = self.both("submit", cfg)
        self.assertEqual(plain.returncode, 2)
        self.assertEqual(err["code"], "bad_job")
        self.assertEqual((err["file"], err["line"], err["section"], err["key"]), (cfg, 3, "job", "device"))
        self.assertTrue(plain.stderr.startswith("gradctl submit: %s:3: [job] device: no device 'cuda:7'" % cfg),
                        plain.stderr)
        plain, _, err = self.both("submit", "-", stdin=text)
        self.assertEqual((plain.returncode, err["file"], err["line"]), (2, "(stdin)", 3))
        self.assertTrue(plain.stderr.startswith("gradctl submit: (stdin):3: [job] device: "), plain.stderr)
        self.assertNotIn(self.tmp, plain.stderr)
        # A daemon error that is not about a job file.
        plain, _, err = self.both("status", "999")
        self.assertEqual((plain.returncode, err["code"], err["message"]), (1, "not_found", "no job 999"))
        self.assertEqual(plain.stderr, "gradctl status: no job 999\n")

    def test_unreachable_daemon(self):
        sock = os.path.join(self.tmp, "nobody-here.sock")
        plain, _, err = self.both("list", sock=sock)
        self.assertEqual(plain.returncode, 3)
        self.assertEqual((err["code"], err["socket"]), ("unreachable", sock))
        self.assertTrue(plain.stderr.startswith("gradctl list: cannot reach gradd at %s: " % sock), plain.stderr)
        self.assertIn("Start it with `gradd -s %s`" % sock, plain.stderr)
        # A directory (a state dir, say) given for the socket: said so, not
        # "start gradd there", which gradd would refuse.
        plain, _, err = self.both("list", sock=self.tmp)
        self.assertEqual(plain.returncode, 3)
        self.assertIn("%s is a directory, not a socket: -s and GRADD_SOCKET name the socket itself" % self.tmp,
                      plain.stderr)
        self.assertNotIn("Start it with", plain.stderr)

    def test_usage_errors(self):
        for args, message in ((["list", "--bogus"], "unknown option '--bogus'"),
                              (["list", "--user"], "--user needs a value"),
                              (["cancel", "-1"], "'-1' is not a job id (a number, as `gradctl list` shows)"),
                              (["list", "--user", "nosuchuser"], "no user nosuchuser")):
            plain, _, err = self.both(*args)
            self.assertEqual((plain.returncode, err["code"], err["message"]), (2, "usage", message), args)
            self.assertTrue(plain.stderr.startswith("gradctl %s: %s\n" % (args[0], message)), plain.stderr)
            self.assertNotIn(GRADCTL, plain.stderr)
        # Before the command too, naming gradctl rather than its path.
        plain, _, err = self.both("--bogus", "list")
        self.assertEqual((plain.returncode, err["message"]), (2, "unknown option '--bogus'"))
        self.assertTrue(plain.stderr.startswith("gradctl: unknown option '--bogus'\n"), plain.stderr)

    def test_unknown_command_and_help(self):
        plain, _, err = self.both("lst")
        self.assertEqual((plain.returncode, err["suggestion"]), (2, "list"))
        self.assertTrue(plain.stderr.startswith("gradctl: unknown command 'lst'; did you mean \"list\"?\n"),
                        plain.stderr)
        # One usage line, not the whole help.
        self.assertEqual(len(plain.stderr.splitlines()), 2, plain.stderr)
        # Two letters swapped is one typo: status, not stats (one deletion
        # away too, but not of the word's length).
        for typo, meant in (("stauts", "status"), ("sttaus", "status"), ("stat", "stats"), ("subimt", "submit")):
            plain, _, err = self.both(typo)
            self.assertEqual(err["suggestion"], meant, typo)
        plain, _, err = self.both("frobnicate")
        self.assertNotIn("did you mean", plain.stderr)
        r = self.d.ctl("help", "list")
        self.assertTrue(r.stdout.startswith("usage: gradctl [-s PATH] [--json] list [--user USER]"), r.stdout)
        self.assertEqual(r.stdout, self.d.ctl("list", "-h").stdout)
        self.assertNotIn("commands:", r.stdout)

    def test_timeline_and_metrics_json(self):
        path = os.path.join(self.tmp, "trace.json")
        out = self.d.ctl_json("timeline", "-o", path)
        self.assertEqual((out["path"], out["bytes"]), (path, os.path.getsize(path)))
        with open(path) as f:
            json.load(f)
        metrics = self.d.ctl_json("metrics")["metrics"]
        up = [m for m in metrics if m["name"] == "gradd_up"]
        self.assertEqual(up, [{"name": "gradd_up", "labels": {}, "value": 1, "type": "gauge",
                               "help": "Whether gradd is serving."}])
        total = [m for m in metrics if m["name"] == "gradd_device_memory_total_bytes"]
        self.assertEqual(total[0]["labels"], {"device": "cpu0", "kind": "cpu"})
        self.assertIsInstance(total[0]["value"], int)

    # ---- option values are the options' own ------------------------------------------

    def test_prompt_that_looks_like_an_option_reaches_the_daemon(self):
        # A model that does not read bytes refuses any prompt, saying so:
        # the daemon's answer shows that "--json" arrived as the prompt.
        jid = self.submit(self.gpt("words", steps=2, vocab=300))
        self.assertEqual(harness.wait_job(self.d, jid, ("completed", "failed"))["state"], "completed")
        self.d.ctl("sample", str(jid), "--tokens", "2")  # no prompt: fine
        for prompt in ("--json", "--help", "-h"):
            r = self.d.ctl("sample", str(jid), "--prompt", prompt, "--tokens", "2", check=False)
            self.assertEqual(r.returncode, 1, (prompt, r.stdout, r.stderr))
            self.assertIn("gradctl sample: prompt: the model's vocabulary has 300 tokens", r.stderr)
            self.assertEqual(r.stdout, "")
        r = self.d.ctl("--json", "sample", str(jid), "--prompt", "--json", "--tokens", "2", check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("vocabulary has 300 tokens", json.loads(r.stdout)["error"]["message"])
        # --json after the command is still gradctl's, parsed as an option.
        r = self.d.ctl("status", str(jid), "--json")
        self.assertEqual(json.loads(r.stdout)["id"], jid)

    # ---- watch, logs ----------------------------------------------------------------

    def test_piped_watch_prints_a_line_a_second(self):
        jid = self.submit(self.gpt("long", steps=1000000))
        harness.wait_job(self.d, jid, ("running",))
        p = subprocess.Popen([GRADCTL, "-s", self.d.sock, "watch", str(jid)], stdout=subprocess.PIPE, text=True)
        time.sleep(3.2)
        p.kill()
        out = p.communicate()[0]
        lines = out.splitlines()
        # The first at once, then one a second: 4, and one more for slack.
        self.assertGreaterEqual(len(lines), 2, out)
        self.assertLessEqual(len(lines), 5, out)
        self.assertTrue(all(l.startswith("step ") for l in lines), out)
        self.d.ctl("cancel", str(jid))
        j = harness.wait_job(self.d, jid, ("cancelled",))
        # The final line says "cancelled" once, not "cancelled at step
        # N/M: cancelled at step N".
        r = self.d.ctl("watch", str(jid), check=False)
        self.assertEqual(r.returncode, 1)
        last = r.stdout.splitlines()[-1]
        self.assertEqual(last, "job %d %s" % (jid, j["reason"]))
        self.assertEqual(last.count("cancelled"), 1, last)

    def test_logs_follow_until_the_job_ends_and_tail(self):
        script = self.write("printer.py", PRINTER)
        jid = self.submit(self.program("printer", "%s %s" % (PY, script)))
        started = time.time()
        r = self.d.ctl("logs", "-f", str(jid))
        took = time.time() - started
        j = self.d.ctl_json("status", str(jid))
        self.assertEqual(j["state"], "completed")
        lines = r.stdout.splitlines()
        self.assertEqual([l for l in lines if l.startswith("line ")], ["line %d" % i for i in range(10)], r.stdout)
        self.assertEqual(lines[-1], "== job %d completed" % jid, r.stdout)
        # It followed the job (about two seconds of output) and ended with
        # it, not after some timeout.
        self.assertGreater(took, 1.5, r.stdout)
        self.assertLess(took, 15, r.stdout)
        r = self.d.ctl("logs", "--tail", "3", str(jid))
        self.assertEqual(r.stdout, "line 8\nline 9\n== job %d completed\n" % jid)
        r = self.d.ctl("logs", "-n", "100000", str(jid))
        self.assertEqual(r.stdout, self.d.ctl("logs", str(jid)).stdout)
        # Following a failed job exits 1, as watch does.
        bad = self.submit(self.program("fails", "false"))
        r = self.d.ctl("logs", "-f", str(bad), check=False)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("== job %d failed" % bad, r.stdout)
        r = self.d.ctl("logs", "--tail", "0", str(bad), check=False)
        self.assertEqual(r.returncode, 2)

    # ---- tables ---------------------------------------------------------------------

    def test_list_columns_for_scripts(self):
        jid = self.submit(self.program("done", "true"))
        harness.wait_job(self.d, jid, ("completed",))
        r = self.d.ctl("list", "-o", "id,state", "--noheadings")
        self.assertEqual(r.stdout, "%d  completed\n" % jid)
        r = self.d.ctl("list", "--columns", "State,NAME,last_change")
        self.assertEqual(r.stdout, "STATE      NAME  LAST CHANGE\ncompleted  done  -\n")
        head = self.d.ctl("list").stdout.splitlines()[0].split()
        self.assertIn("FIT", head)
        self.assertNotIn("MAX", head)
        r = self.d.ctl("list", "-o", "id,bogus", check=False)
        self.assertEqual(r.returncode, 2)
        self.assertIn("no column 'bogus'; the columns are ID,USER,NAME,STATE", r.stderr)


class FollowRewrite(harness.DaemonTest):
    # The smallest bound: the log is rewritten while it is followed.
    conf = "[daemon]\nclient_timeout = 60s\nmax_job_log = 64K\n"

    def test_follow_goes_on_across_rewrites(self):
        tmp, _ = harness.scratch_corpus(self, "gradd-cli-")
        script = os.path.join(tmp, "chatty.py")
        with open(script, "w") as f:
            f.write("import time\nfor i in range(3000):\n    print('line %05d ' % i + 'x' * 90, flush=True)\n"
                    "    if i % 100 == 0: time.sleep(0.03)\n")
        cfg = os.path.join(tmp, "chatty.cfg")
        harness.write_job(cfg, {"job": {"type": "program", "name": "chatty"},
                                "program": {"command": "%s %s" % (PY, script)}})
        jid = int(self.d.ctl("submit", cfg).stdout.split()[1])
        r = self.d.ctl("logs", "-f", str(jid))
        lines = r.stdout.splitlines()
        nums = [int(l.split()[1]) for l in lines if l.startswith("line ")]
        # 300K through a 64K log: some dropped (the marker says so), none
        # twice or out of order, and the end reached.
        self.assertEqual(nums, sorted(set(nums)), r.stdout[-2000:])
        self.assertEqual(nums[-1], 2999)
        self.assertEqual(lines[-1], "== job %d completed" % jid)
        self.assertIn("bytes dropped here to keep it within [daemon] max_job_log", r.stdout)


if __name__ == "__main__":
    harness.main()
