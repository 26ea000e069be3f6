#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpus (committed under fuzz/corpus/), from a checkpoint
the trainer wrote: python3 fuzz/make_seeds.py CHECKPOINT.safetensors"""
import gzip
import os
import struct
import sys

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def put(target, name, data):
    os.makedirs(os.path.join(root, target), exist_ok=True)
    with open(os.path.join(root, target, name), "wb") as f:
        f.write(data)


def images(count):
    return struct.pack(">IIII", 0x803, count, 28, 28) + bytes(range(256)) * (count * 784 // 256) + bytes(count * 784 % 256)


def labels(count):
    return struct.pack(">II", 0x801, count) + bytes(i % 10 for i in range(count))


idx = {"images": b"\x01" + images(2), "labels": b"\x00" + labels(5), "header_only": b"\x01" + images(3)[:16],
       "bad_label": b"\x00" + labels(2)[:-1] + b"\x0a", "empty_labels": b"\x00" + labels(0)}
for name, data in idx.items():
    put("idx_raw", name, data)
    put("idx_gzip", name, data)
put("idx_raw", "gzip_images", b"\x01" + gzip.compress(images(2), mtime=0))

ckpt = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", ckpt[:8])[0]
header = ckpt[8:8 + n]
put("checkpoint", "header_with_momentum", b"\x02" + header)
put("checkpoint", "header_with_nan", b"\x06" + header)
put("checkpoint", "truncated_file", b"\x01" + ckpt[:8 + n + 64])
put("checkpoint", "header_length_too_large", b"\x01" + struct.pack("<Q", 1 << 40) + b"{}")
