"""Reports from a program job to the daemon that runs it.

gradd's daemon puts GRADD_SOCKET (its control socket) and GRADD_JOB_ID in
every program job's environment.  A report tells it the micro-batch the
program trains with, so that `gradctl status` shows a program job's
micro-batch x accumulation and its last change as it shows an engine
job's.

The request is encoded here by hand, without the protobuf package (which a
program's environment may lack or have in another version): a frame is a
4-byte big-endian length and one gradd.Request (proto/gradd.proto), whose
`report` field (29) holds a ReportRequest.  Training never stops because
of a report: without the two variables nothing is sent, and a daemon that
is away, slow or refuses gets a warning once, then the program goes on.
"""
import os
import struct
import time

PROTOCOL_VERSION = 1
REQUEST_REPORT = 29
RESPONSE_ERROR = 9
RESPONSE_REPORT = 29
# The daemon answers at once; a report must never hold up a training step
# for long, even when the daemon is stopped or wedged.
TIMEOUT_S = 1.0
# An answer to a report is a few bytes; anything longer is not one.
MAX_ANSWER = 64 << 10
# What the daemon keeps of a reason ("oom", "grow", "start").
REASONS = ("", "start", "oom", "grow")
ERROR_CODES = {0: "UNKNOWN", 1: "VERSION_MISMATCH", 2: "BAD_REQUEST", 3: "NOT_FOUND",
               4: "PERMISSION_DENIED", 5: "UNAVAILABLE", 6: "INTERNAL", 7: "BAD_JOB"}


class ReportError(Exception):
    """The daemon could not be reached or refused a report."""

    def __init__(self, message, code=None):
        super().__init__(message)
        self.code = code  # the daemon's Error code name, None when it did not answer


# ---- protobuf wire format --------------------------------------------------

def _varint(n):
    if n < 0:
        raise ValueError("varint of a negative number")
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _key(num, wire_type):
    return _varint(num << 3 | wire_type)


def _uint(num, value):
    return _key(num, 0) + _varint(int(value)) if value else b""


def _bytes(num, data):
    return _key(num, 2) + _varint(len(data)) + data


def _double(num, value):
    return _key(num, 1) + struct.pack("<d", value)


def encode_report(job_id, micro, accum, step=0, change_from=0, change_to=0, reason="", loss=None):
    """The frame of a Request holding a ReportRequest (proto/gradd.proto)."""
    if reason not in REASONS:
        raise ValueError("reason must be one of %s, not %r" % (", ".join(repr(r) for r in REASONS), reason))
    body = (_uint(1, job_id) + _uint(2, micro) + _uint(3, accum) + _uint(4, step)
            + _uint(5, change_from) + _uint(6, change_to))
    if reason:
        body += _bytes(7, reason.encode())
    if loss is not None:
        body += _uint(8, 1) + _double(9, float(loss))
    msg = _uint(1, PROTOCOL_VERSION) + _bytes(REQUEST_REPORT, body)
    return struct.pack(">I", len(msg)) + msg


def _read_varint(b, i):
    n = shift = 0
    while True:
        if i >= len(b) or shift > 63:
            raise ValueError("truncated varint")
        c = b[i]
        i += 1
        n |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            return n, i


def decode_fields(b):
    """{field number: [values]} of one message: ints for varints and fixed
    fields, bytes for length-delimited ones."""
    fields = {}
    i = 0
    while i < len(b):
        key, i = _read_varint(b, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _read_varint(b, i)
        elif wt == 1:
            if i + 8 > len(b):
                raise ValueError("truncated fixed64")
            v, i = int.from_bytes(b[i:i + 8], "little"), i + 8
        elif wt == 2:
            n, i = _read_varint(b, i)
            if i + n > len(b):
                raise ValueError("truncated field %d" % num)
            v, i = b[i:i + n], i + n
        elif wt == 5:
            if i + 4 > len(b):
                raise ValueError("truncated fixed32")
            v, i = int.from_bytes(b[i:i + 4], "little"), i + 4
        else:
            raise ValueError("wire type %d" % wt)
        fields.setdefault(num, []).append(v)
    return fields


def decode_answer(body):
    """None for a report's acknowledgement; ReportError for an Error."""
    fields = decode_fields(body)
    if RESPONSE_ERROR in fields:
        err = decode_fields(fields[RESPONSE_ERROR][-1])
        code = ERROR_CODES.get(err.get(1, [0])[-1], "UNKNOWN")
        text = err.get(2, [b""])[-1].decode("utf-8", "replace")
        return ReportError("gradd refused the report: %s (%s)" % (text, code), code)
    if RESPONSE_REPORT not in fields:
        return ReportError("gradd answered a report with something else (fields %s)" % sorted(fields))
    return None


# ---- one exchange -----------------------------------------------------------

def _recv_exact(s, n, deadline):
    import socket

    out = bytearray()
    while len(out) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("timed out")
        s.settimeout(left)
        chunk = s.recv(n - len(out))
        if not chunk:
            raise ConnectionError("gradd closed the connection")
        out += chunk
    return bytes(out)


def send_report(path, frame, timeout=TIMEOUT_S):
    """Send one report frame to the daemon at `path` and read its answer;
    ReportError unless it was taken."""
    # Imported here: socket (with enum and selectors) would be most of what
    # `import gradd` costs every Python program under the allocator shim.
    import socket

    deadline = time.monotonic() + timeout
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(path)
            s.sendall(frame)
            (n,) = struct.unpack(">I", _recv_exact(s, 4, deadline))
            if n > MAX_ANSWER:
                raise ReportError("gradd's answer to a report is %d bytes long" % n)
            body = _recv_exact(s, n, deadline)
    except (OSError, ValueError) as e:
        raise ReportError("cannot report to gradd at %s: %s" % (path, e)) from None
    try:
        err = decode_answer(body)
    except ValueError as e:
        raise ReportError("gradd's answer to a report does not parse: %s" % e) from None
    if err:
        raise err


class Reporter:
    """Sends reports for one job.  Without a socket or job id (a program
    run outside gradd) it sends nothing.  A failed report warns once and is
    otherwise ignored; `errors` counts them and `last_error` keeps the
    latest, for tests and for programs that want to know."""

    def __init__(self, socket_path=None, job_id=None, timeout=TIMEOUT_S):
        if socket_path is None:
            socket_path = os.environ.get("GRADD_SOCKET") or None
        if job_id is None:
            raw = os.environ.get("GRADD_JOB_ID", "")
            job_id = int(raw) if raw.isdigit() and 0 < int(raw) < 1 << 32 else None
        self.socket_path = socket_path
        self.job_id = job_id
        self.timeout = timeout
        self.sent = 0
        self.errors = 0
        self.last_error = None
        self._warned = False

    @property
    def enabled(self):
        return bool(self.socket_path) and self.job_id is not None

    def report(self, micro, accum, step=0, change_from=0, change_to=0, reason="", loss=None):
        """Tell the daemon the job's micro-batch and accumulation, and with
        `reason` a change of the micro-batch from change_from to change_to.
        True when the daemon took it."""
        if not self.enabled:
            return False
        frame = encode_report(self.job_id, micro, accum, step, change_from, change_to, reason, loss)
        try:
            send_report(self.socket_path, frame, self.timeout)
        except ReportError as e:
            self.errors += 1
            self.last_error = e
            if not self._warned:
                import warnings

                self._warned = True
                warnings.warn("%s; training goes on without reports" % e, RuntimeWarning, stacklevel=3)
            return False
        self.sent += 1
        return True


_default = None


def default_reporter():
    """The Reporter for this process's job, from its environment (made at
    first use)."""
    global _default
    if _default is None:
        _default = Reporter()
    return _default


def reset():
    """Forget the default Reporter, so that the next use reads the
    environment again (tests, a forked worker)."""
    global _default
    _default = None
