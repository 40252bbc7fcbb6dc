"""Harness source: the message channel every role of the harness speaks, and what a role says first.

Pasted after `plaincodec`'s source (and the legacy layers') into the program every sandbox runs
(`launch.harness_source`), standard library only: nothing here may import mentor. One JSON object
per line on two raw fds, keys distinct (`Channel`); `first_message` moves them off fds 0/1 and says
hello with `identity`, the facts the caller checks before any untrusted code runs.
"""

import json
import os
import sys

MAX_LINE = 8 << 20


def _distinct(pairs):
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise ValueError("a JSON object with a repeated key")
    return obj


class _Channel:
    """Newline-delimited JSON objects on two raw fds."""

    def __init__(self, rfd, wfd):
        self.rfd, self.wfd, self.buf = rfd, wfd, bytearray()

    def send(self, obj):
        data = (json.dumps(obj, separators=(",", ":"), allow_nan=False) + "\n").encode()
        while data:
            data = data[os.write(self.wfd, data):]

    def recv(self):
        """The next object; None at the end of the stream or past MAX_LINE; ValueError when the line is
        not one JSON object with distinct keys (calls and replies are relayed unparsed by the caller)."""
        scanned = 0
        while True:
            nl = self.buf.find(b"\n", scanned)
            if nl >= 0:
                break
            scanned = len(self.buf)
            if scanned > MAX_LINE:
                return None
            chunk = os.read(self.rfd, 1 << 20)
            if not chunk:
                return None
            self.buf += chunk
        line = bytes(self.buf[:nl])
        del self.buf[:nl + 1]
        try:
            obj = json.loads(line.decode("utf-8"), object_pairs_hook=_distinct)
        except RecursionError:
            raise ValueError("nested too deeply") from None
        if type(obj) is not dict:
            raise ValueError("not a JSON object")
        return obj


def first_message(layers):
    """The private channel and the parent's first message on it (None: the parent sent nothing)."""
    chan = _private_channel(layers)
    return chan, chan.recv()


def _private_channel(layers):
    """Move the message pipes off fds 0/1 (which become /dev/null), say hello, then silence fd 2 as well."""
    rfd, wfd = os.dup(0), os.dup(1)
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    sys.stdin = open(0, "r", closefd=False)
    sys.stdout = open(1, "w", closefd=False)
    chan = _Channel(rfd, wfd)
    chan.send({"hello": identity(), "layers": layers})
    os.dup2(null, 2)  # the caller stops reading stderr after the hello
    os.close(null)
    return chan



def identity():
    """Facts the caller checks before any untrusted code runs."""
    caps, nnp = None, None
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    caps = int(line.split()[1], 16)
                elif line.startswith("NoNewPrivs:"):
                    nnp = int(line.split()[1])
    except OSError:
        pass
    return {"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "groups": os.getgroups(),
            "caps": caps, "nnp": nnp, "pid": os.getpid(), "prefix": sys.prefix}


def exc_name(exc):
    try:
        return str(type(exc).__name__)[:80]
    except BaseException:
        return "?"


def describe(exc):
    try:
        return ("%s: %s" % (exc_name(exc), exc))[:300]
    except BaseException:
        return exc_name(exc)

