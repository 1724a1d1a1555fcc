#!/usr/bin/env python3
"""An independent reader of TensorBoard event files (stdlib only).

Usage: read_events.py FILE_OR_DIR...

Reads every events.out.tfevents.* file, checks the TFRecord framing
(both masked CRC-32C of each record, computed here bit by bit, not by
the writer's code) and decodes the Event protos with a minimal
protobuf decoder. Prints one JSON object per file:
{"file": ..., "file_version": ..., "events": [{"step", "wall_time",
"values": {tag: simple_value}}]}. Exits non-zero on any malformed byte.
"""
import json
import os
import struct
import sys


def _crc32c_table():
    poly = 0x82F63B78  # Castagnoli, reflected
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ poly if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc32c_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def varint(buf, i):
    shift = result = 0
    while True:
        if i >= len(buf):
            raise ValueError("truncated varint")
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7


def fields(buf):
    """Yields (field number, wire type, value) of a message."""
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = varint(buf, i)
        elif wt == 1:
            v, i = buf[i:i + 8], i + 8
        elif wt == 2:
            n, i = varint(buf, i)
            v, i = buf[i:i + n], i + n
        elif wt == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise ValueError("wire type %d" % wt)
        if i > len(buf):
            raise ValueError("truncated field %d" % num)
        yield num, wt, v


def event(data):
    ev = {"step": 0, "wall_time": None, "values": {}}
    for num, wt, v in fields(data):
        if num == 1 and wt == 1:
            ev["wall_time"] = struct.unpack("<d", v)[0]
        elif num == 2 and wt == 0:
            ev["step"] = v
        elif num == 3 and wt == 2:
            ev["file_version"] = v.decode()
        elif num == 5 and wt == 2:
            for n2, w2, val in fields(v):
                if n2 != 1 or w2 != 2:
                    continue
                tag, simple = None, None
                for n3, w3, x in fields(val):
                    if n3 == 1 and w3 == 2:
                        tag = x.decode()
                    elif n3 == 2 and w3 == 5:
                        simple = struct.unpack("<f", x)[0]
                if tag is None or simple is None:
                    raise ValueError("summary value without tag or simple_value")
                if tag in ev["values"]:
                    raise ValueError("tag %s twice in one event" % tag)
                ev["values"][tag] = simple
    return ev


def read(path):
    with open(path, "rb") as f:
        raw = f.read()
    i, out = 0, {"file": path, "events": []}
    while i < len(raw):
        if i + 12 > len(raw):
            raise ValueError("%s: truncated header at %d" % (path, i))
        head = raw[i:i + 8]
        (n,) = struct.unpack("<Q", head)
        (hc,) = struct.unpack("<I", raw[i + 8:i + 12])
        if hc != masked(head):
            raise ValueError("%s: bad length CRC at %d" % (path, i))
        data = raw[i + 12:i + 12 + n]
        if len(data) != n or i + 16 + n > len(raw):
            raise ValueError("%s: truncated record at %d" % (path, i))
        (dc,) = struct.unpack("<I", raw[i + 12 + n:i + 16 + n])
        if dc != masked(data):
            raise ValueError("%s: bad data CRC at %d" % (path, i))
        ev = event(data)
        if not out["events"]:
            out["file_version"] = ev.get("file_version")
        out["events"].append(ev)
        i += 16 + n
    return out


def main(args):
    files = []
    for a in args:
        if os.path.isdir(a):
            for root, _, names in os.walk(a):
                files += [os.path.join(root, n) for n in sorted(names) if n.startswith("events.out.tfevents.")]
        else:
            files.append(a)
    for p in sorted(files):
        print(json.dumps(read(p)))


if __name__ == "__main__":
    main(sys.argv[1:])
