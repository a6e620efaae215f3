#!/usr/bin/env python3
"""Reads TensorBoard event files without TensorFlow or the writer's code, from the formats' specs:
TFRecord framing (uint64 length, masked CRC-32C of it, data, masked CRC-32C of the data; all little-endian)
and the protocol buffer wire format of Event / Summary / SessionLog (tensorflow/core/util/event.proto,
tensorflow/core/framework/summary.proto). Prints one JSON object per event:
  {"step", "wall_time", "file_version"?, "scalars": {tag: value}?, "texts": {tag: text}?, "session_log"?}
Exits 1 naming the file and offset at the first bad checksum or truncated record."""
import json
import struct
import sys


def crc32c(data: bytes) -> int:
    # Bitwise CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as RFC 3720 defines it.
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(data: bytes) -> int:
    c = crc32c(data)
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def fields(buf: bytes):
    """Yields (field number, wire type, value) of one protobuf message."""
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = varint(buf, i)
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        elif wire == 2:
            n, i = varint(buf, i)
            value, i = buf[i:i + n], i + n
        elif wire == 5:
            value, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"wire type {wire}")
        yield number, wire, value


def varint(buf: bytes, i: int):
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, i


def event(buf: bytes) -> dict:
    out = {}
    for number, _, value in fields(buf):
        if number == 1:
            out["wall_time"] = struct.unpack("<d", value)[0]
        elif number == 2:
            out["step"] = value
        elif number == 3:
            out["file_version"] = value.decode()
        elif number == 5:
            for n, _, v in fields(value):  # Summary.value
                if n != 1:
                    continue
                tag, simple, tensor, plugin = None, None, None, None
                for vn, _, vv in fields(v):
                    if vn == 1:
                        tag = vv.decode()
                    elif vn == 2:
                        simple = struct.unpack("<f", vv)[0]
                    elif vn == 8:
                        tensor = [sv.decode() for tn, _, sv in fields(vv) if tn == 8]
                    elif vn == 9:
                        for mn, _, mv in fields(vv):
                            if mn == 1:
                                plugin = [pv.decode() for pn, _, pv in fields(mv) if pn == 1][0]
                if simple is not None:
                    out.setdefault("scalars", {})[tag] = simple
                elif tensor is not None and plugin == "text":
                    out.setdefault("texts", {})[tag] = tensor[0]
        elif number == 6:
            status = [v for n, _, v in fields(value) if n == 1]
            out["session_log"] = {1: "START", 2: "STOP", 3: "CHECKPOINT"}.get(status[0] if status else 0, "?")
    out.setdefault("step", 0)
    return out


def main() -> int:
    assert crc32c(b"123456789") == 0xE3069283  # the published check value
    for path in sys.argv[1:]:
        data = open(path, "rb").read()
        at = 0
        while at < len(data):
            if len(data) - at < 12:
                print(f"{path}: truncated record header at offset {at}", file=sys.stderr)
                return 1
            header = data[at:at + 8]
            (n,) = struct.unpack("<Q", header)
            (length_crc,) = struct.unpack("<I", data[at + 8:at + 12])
            body = data[at + 12:at + 12 + n]
            if len(body) < n or len(data) < at + 16 + n:
                print(f"{path}: truncated record at offset {at}", file=sys.stderr)
                return 1
            (data_crc,) = struct.unpack("<I", data[at + 12 + n:at + 16 + n])
            if length_crc != masked(header) or data_crc != masked(body):
                print(f"{path}: bad checksum at offset {at}", file=sys.stderr)
                return 1
            print(json.dumps(event(body)))
            at += 16 + n
    return 0


if __name__ == "__main__":
    sys.exit(main())
