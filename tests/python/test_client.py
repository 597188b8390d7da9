"""gradd._client: the report's bytes, as a fake daemon on a Unix socket
receives them (decoded by the integration tests' harness, not by the
package), its answers,
and a daemon that refuses, is away or never answers: a warning once and
training goes on, within the timeout.  Pure Python: no torch needed."""
import os
import shutil
import socket
import struct
import sys
import tempfile
import threading
import time
import unittest
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))

import gradd  # noqa: E402
import harness  # noqa: E402
from gradd import _client  # noqa: E402


def report_fields(body):
    """The Request's version and its ReportRequest's fields."""
    req = harness.parse_fields(body)
    assert set(req) == {1, 29}, req
    return req[1], harness.parse_fields(req[29][0])


ACK = b"\x08\x01" + b"\xea\x01\x00"  # Response{version 1, report {}}


def error_answer(code, text):
    err = b"\x08" + bytes([code]) + b"\x12" + bytes([len(text)]) + text.encode()
    return b"\x08\x01" + b"\x4a" + bytes([len(err)]) + err


class FakeDaemon:
    """Accepts connections on a socket and answers each frame with
    `answer` (None: reads and never answers); keeps the request bodies."""

    def __init__(self, path, answer=ACK):
        self.path, self.answer, self.bodies = path, answer, []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(8)
        self.stop = False
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        while not self.stop:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            with c:
                self.bodies.append(harness.recv_frame(c))
                if self.answer is None:
                    time.sleep(3)
                    continue
                c.sendall(harness.frame(self.answer))

    def close(self):
        self.stop = True
        self.sock.close()


class Reports(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="gradd-client-")
        self.path = os.path.join(self.dir, "gradd.sock")
        self.daemon = None
        _client.reset()

    def tearDown(self):
        if self.daemon:
            self.daemon.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        _client.reset()

    def serve(self, answer=ACK):
        self.daemon = FakeDaemon(self.path, answer)

    def test_request_bytes(self):
        self.serve()
        r = _client.Reporter(self.path, 7)
        self.assertTrue(r.report(8, 4, 120, 16, 8, "oom", 2.5))
        self.assertTrue(r.report(8, 4, 121))
        self.assertEqual(report_fields(self.daemon.bodies[0]),
                         ([harness.PROTOCOL_VERSION], {1: [7], 2: [8], 3: [4], 4: [120], 5: [16], 6: [8], 7: [b"oom"],
                                                       8: [1], 9: [struct.pack("<d", 2.5)]}))
        # No change and no loss: only what is set.
        self.assertEqual(report_fields(self.daemon.bodies[1])[1], {1: [7], 2: [8], 3: [4], 4: [121]})
        self.assertEqual((r.sent, r.errors), (2, 0))

    def test_environment(self):
        self.serve()
        env = {"GRADD_SOCKET": self.path, "GRADD_JOB_ID": "12"}
        old = {k: os.environ.get(k) for k in env}
        try:
            os.environ.update(env)
            self.assertTrue(gradd.report_batch(4, 2, step=3, change_from=8, reason="oom"))
            self.assertEqual(_client.default_reporter().job_id, 12)
            for bad in ("", "x", "0", str(1 << 32)):
                os.environ["GRADD_JOB_ID"] = bad
                _client.reset()
                self.assertFalse(_client.default_reporter().enabled, bad)
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        self.assertEqual(report_fields(self.daemon.bodies[0])[1],
                         {1: [12], 2: [4], 3: [2], 4: [3], 5: [8], 6: [4], 7: [b"oom"]})

    def test_outside_gradd_nothing_is_sent(self):
        r = _client.Reporter(socket_path="", job_id=None)
        self.assertFalse(r.enabled)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            self.assertFalse(r.report(4, 2))
        self.assertEqual((r.sent, r.errors), (0, 0))

    def test_refused_warns_once(self):
        self.serve(error_answer(4, "job 7 belongs to alice"))
        r = _client.Reporter(self.path, 7)
        with self.assertWarnsRegex(RuntimeWarning, r"gradd refused the report: job 7 belongs to alice "
                                                   r"\(PERMISSION_DENIED\); training goes on"):
            self.assertFalse(r.report(4, 2))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            self.assertFalse(r.report(4, 2))
        self.assertEqual((r.sent, r.errors, r.last_error.code), (0, 2, "PERMISSION_DENIED"))

    def test_daemon_away(self):
        r = _client.Reporter(os.path.join(self.dir, "none.sock"), 7)
        with self.assertWarnsRegex(RuntimeWarning, "cannot report to gradd at .*none.sock"):
            self.assertFalse(r.report(4, 2))

    def test_silent_daemon_times_out(self):
        self.serve(answer=None)
        r = _client.Reporter(self.path, 7, timeout=0.3)
        t0 = time.monotonic()
        with self.assertWarnsRegex(RuntimeWarning, "timed out"):
            self.assertFalse(r.report(4, 2))
        self.assertLess(time.monotonic() - t0, 2.0)

    def test_oversized_answer(self):
        self.serve(b"\x00" * (_client.MAX_ANSWER + 1))
        r = _client.Reporter(self.path, 7)
        with self.assertWarnsRegex(RuntimeWarning, "answer to a report is 65537 bytes long"):
            self.assertFalse(r.report(4, 2))

    def test_bad_reason(self):
        with self.assertRaisesRegex(ValueError, "reason must be one of"):
            _client.encode_report(1, 4, 2, reason="shrink")


if __name__ == "__main__":
    unittest.main()
