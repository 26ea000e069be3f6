#!/usr/bin/python3
"""bench/plot.py on generated records: curves of two runs and the comparison bars are
PNG files; a file that is not JSON lines fails with its name."""
import json
import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

PLOT = Path(os.environ.get("MNIST_MT_SOURCE_ROOT", Path(__file__).resolve().parent.parent)) / "bench" / "plot.py"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def epoch(i, accuracy):
    return {"epoch": i, "train_loss": 1.0 / i, "test_loss": 0.8 / i, "test_accuracy": accuracy,
            "images_per_s": 1000.0 + i, "seconds": 1.0, "steps": 10}


def write_lines(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


class Plot(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def plot(self, *args):
        return subprocess.run([sys.executable, str(PLOT), *map(str, args)], capture_output=True, text=True,
                              timeout=120)

    def test_curves_of_two_runs(self):
        a, b = self.dir / "a.jsonl", self.dir / "b.jsonl"
        write_lines(a, [epoch(1, 0.9), epoch(2, 0.95)])
        write_lines(b, [epoch(1, 0.8), epoch(2, 0.85), epoch(3, 0.9)])
        out = self.dir / "curves.png"
        done = self.plot("curves", out, f"{a}=first", b)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(out.read_bytes()[:8], PNG_MAGIC)

    def test_comparison_bars(self):
        record = {"isa": "native", "device": "cpu", "ranks": 2, "batch_size": 64, "epochs": 1, "max_steps": 0,
                  "mnist_mt": {"summary": {"images_per_s": 3000.0}, "epochs": [epoch(1, 0.9)]},
                  "template": {"summary": {"images_per_s": 1000.0}, "epochs": [epoch(1, 0.9)]}}
        results = self.dir / "compare.jsonl"
        write_lines(results, [record, dict(record, batch_size=4)])
        out = self.dir / "bars.png"
        done = self.plot("bars", out, results)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(out.read_bytes()[:8], PNG_MAGIC)

    def test_bad_input_names_the_file(self):
        bad = self.dir / "bad.jsonl"
        bad.write_text("not json\n")
        done = self.plot("curves", self.dir / "x.png", bad)
        self.assertNotEqual(done.returncode, 0)
        self.assertIn("bad.jsonl", done.stderr)
        self.assertFalse((self.dir / "x.png").exists())


if __name__ == "__main__":
    unittest.main()
