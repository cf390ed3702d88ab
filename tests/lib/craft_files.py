#!/usr/bin/env python3
"""craft_files.py — damage a checkpoint or a model file the way no checksum would catch: change a
value, then recompute every CRC-32C (Castagnoli) the file format has, as its writer would. What the
readers must then refuse on their own (tests/checkpoint/fault_check.sh, tests/tools/cli_check.sh).

  craft_files.py manifest DIR KEY VALUE      set MANIFEST line "KEY ..." to "KEY VALUE"
  craft_files.py nan_shard DIR RANK [INDEX]  parameter INDEX (default 0) of rank-RANK.shard := NaN
  craft_files.py nan_model FILE INDEX        weight INDEX of a model file := NaN (format: docs/files.md)
"""
import struct
import sys

TABLE = []
for i in range(256):
    c = i
    for _ in range(8):
        c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
    TABLE.append(c)


def crc32c(data, crc=0):
    crc ^= 0xFFFFFFFF
    for b in data:
        crc = TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283  # the published check value


def write_manifest(path, lines):
    """The MANIFEST's lines without its "end" line; appends it with the checksum of all before it."""
    body = "".join(l + "\n" for l in lines)
    with open(path, "w") as f:
        f.write(body + "end %08x\n" % crc32c(body.encode()))


def read_manifest(path):
    lines = open(path).read().splitlines()
    assert lines[-1].startswith("end "), path
    return lines[:-1]


def main():
    what = sys.argv[1]
    if what == "manifest":
        d, key, value = sys.argv[2:5]
        lines = read_manifest(d + "/MANIFEST")
        lines = [key + " " + value if l.split(" ")[0] == key else l for l in lines]
        write_manifest(d + "/MANIFEST", lines)
    elif what == "nan_shard":
        d, rank = sys.argv[2], int(sys.argv[3])
        index = int(sys.argv[4]) if len(sys.argv) > 4 else 0
        name = "rank-%05d.shard" % rank
        data = bytearray(open(d + "/" + name, "rb").read())
        units = struct.unpack_from("<I", data, 8 + 4 * 4)[0]  # header: magic, version, rank, world, precision, U
        precision = struct.unpack_from("<I", data, 8 + 3 * 4)[0]
        at = 8 + 6 * 4 + 32 * units  # the params follow the header (checkpoint.h)
        if precision == 0:
            struct.pack_into("<f", data, at + 4 * index, float("nan"))
        else:  # bf16 and fp16: an all-ones exponent with a mantissa is NaN in both
            struct.pack_into("<H", data, at + 2 * index, 0x7FC0 if precision == 1 else 0x7E00)
        open(d + "/" + name, "wb").write(data)
        lines = read_manifest(d + "/MANIFEST")
        for i, l in enumerate(lines):
            f = l.split(" ")
            if f[0] == "file" and f[1] == name:
                lines[i] = "file %s %s %08x" % (name, f[2], crc32c(data))
        write_manifest(d + "/MANIFEST", lines)
    elif what == "nan_model":
        path, index = sys.argv[2], int(sys.argv[3])
        data = bytearray(open(path, "rb").read())
        struct.pack_into("<f", data, 8 + 4 + 5 * 4 + 8 + 4 * index, float("nan"))
        struct.pack_into("<I", data, len(data) - 4, crc32c(data[:-4]))
        open(path, "wb").write(data)
    else:
        sys.exit("craft_files.py: unknown action " + what)


main()
