#!/usr/bin/python3
"""bench/time_to_accuracy.py and bench/pytorch/recipe.py.

The driver runs against stand-ins for mnist_mt and PyTorch that record their arguments:
both sides get the same recipe and global batch, every seed runs on every side, and the
table and the JSON line carry their figures. recipe.py runs for real (Debian's PyTorch,
skipped without it) on a few hundred random images: evaluations fall every --eval-every
steps and at each epoch's end, a target stops the run at the first evaluation reaching it,
and DDP over two processes trains the same steps.
"""
import json
import os
import shlex
import struct
import subprocess
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path

ROOT = Path(os.environ.get("MNIST_MT_SOURCE_ROOT", Path(__file__).resolve().parent.parent))
DRIVER = ROOT / "bench" / "time_to_accuracy.py"
RECIPE = ROOT / "bench" / "pytorch" / "recipe.py"
TORCH_PYTHON = "/usr/bin/python3"

# A stand-in mnist_mt: its help names the flags, and a run writes one metrics line whose
# figures come from the seed, as a run with a target would.
FAKE_MNIST_MT = textwrap.dedent("""\
    #!{python}
    import json, sys
    argv = sys.argv[1:]
    if argv == ["--help"]:
        print("--optimizer --lr-schedule --target-accuracy --eval-every")
        sys.exit(0)
    with open({log!r}, "a") as f:
        f.write(json.dumps(argv) + "\\n")
    seed = int(argv[argv.index("--seed") + 1])
    with open(argv[argv.index("--metrics") + 1], "w") as f:
        f.write(json.dumps({{"epoch": 0, "test_accuracy": 0.99 + seed / 1000, "images_per_s": 100.0 * seed,
                            "seconds": 10.0, "eval_seconds": 1.0, "time_to_target_s": 10.0 * seed,
                            "target_step": 400 + seed, "target_eval_seconds": 1.0}}) + "\\n")
""")
# A stand-in Python for recipe.py: records the arguments, prints a result.
FAKE_TORCH = textwrap.dedent("""\
    #!{python}
    import json, sys
    argv = sys.argv[2:]
    with open({log!r}, "a") as f:
        f.write(json.dumps(argv) + "\\n")
    seed = int(argv[argv.index("--seed") + 1])
    ranks = int(argv[argv.index("--ranks") + 1])
    print(json.dumps({{"time_to_target_s": 20.0 * seed * ranks, "target_step": 500, "eval_seconds": 2.0,
                      "final_accuracy": 0.991, "images_per_s": 50.0 * seed, "torch_version": "fake",
                      "torch_blas": "none", "torch_libraries": [], "cpu_capability": "none"}}))
""")


def executable(path, text):
    path.write_text(text)
    path.chmod(0o755)
    return path


def flag(argv, name):
    return argv[argv.index(name) + 1]


def write_idx(path, magic, shape, data):
    path.write_bytes(struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in shape) + data)


def random_mnist(directory, train, test):
    for prefix, n in (("train", train), ("t10k", test)):
        write_idx(directory / f"{prefix}-images-idx3-ubyte", 0x803, (n, 28, 28), os.urandom(n * 784))
        write_idx(directory / f"{prefix}-labels-idx1-ubyte", 0x801, (n,), bytes(b % 10 for b in os.urandom(n)))


class Driver(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)
        (self.dir / "build").mkdir()
        self.ours_log, self.theirs_log = self.dir / "ours.log", self.dir / "theirs.log"
        executable(self.dir / "build" / "mnist_mt", FAKE_MNIST_MT.format(python=sys.executable, log=str(self.ours_log)))
        self.torch = executable(self.dir / "python", FAKE_TORCH.format(python=sys.executable, log=str(self.theirs_log)))

    def tearDown(self):
        self.tmp.cleanup()

    def drive(self, *args):
        done = subprocess.run([sys.executable, str(DRIVER), "--build", str(self.dir / "build"), "--data",
                               str(self.dir), "--torch-python", str(self.torch), "--cores", "2", *args],
                              capture_output=True, text=True, timeout=60)
        self.assertEqual(done.returncode, 0, done.stderr)
        return done.stdout

    def runs(self, log):
        return [json.loads(line) for line in log.read_text().splitlines()]

    def test_both_sides_get_the_same_recipe_and_global_batch(self):
        self.drive("--recipe", "fast", "--seeds", "1,2", "--pytorch-ranks", "1,2")
        ours, theirs = self.runs(self.ours_log), self.runs(self.theirs_log)
        self.assertEqual([flag(a, "--seed") for a in ours], ["1", "2"])
        self.assertEqual([(flag(a, "--seed"), flag(a, "--ranks")) for a in theirs],
                         [("1", "1"), ("1", "2"), ("2", "1"), ("2", "2")])
        self.assertEqual(int(flag(ours[0], "--cpu")) * int(flag(ours[0], "--batch-size")), 128)
        for a in theirs:
            self.assertEqual(int(flag(a, "--ranks")) * int(flag(a, "--batch-size")), 128)
            self.assertEqual(flag(a, "--threads"), "2")

        def recipe_flags(argv):
            drop = {"--cpu", "--batch-size", "--metrics", "--threads", "--ranks", "--seed"}
            return [(x, y) for x, y in zip(argv[::2], argv[1::2]) if x not in drop]
        self.assertEqual(recipe_flags(ours[0][2:]), recipe_flags(theirs[0]))
        self.assertEqual(flag(ours[0], "--target-accuracy"), "99.0")
        self.assertEqual(flag(ours[0], "--optimizer"), "adamw")

    def test_gpu_puts_both_sides_on_gpu_0_with_the_whole_batch(self):
        table = self.drive("--recipe", "fast", "--seeds", "1", "--gpu")
        ours, theirs = self.runs(self.ours_log), self.runs(self.theirs_log)
        self.assertEqual(flag(ours[0], "--gpus"), "0")
        self.assertNotIn("--cpu", ours[0])
        self.assertEqual(flag(ours[0], "--batch-size"), "128")
        self.assertEqual(len(theirs), 1)
        self.assertEqual((flag(theirs[0], "--device"), flag(theirs[0], "--ranks")), ("cuda", "1"))
        self.assertEqual(flag(theirs[0], "--batch-size"), "128")
        self.assertIn("GPU 0 each, float32 (TF32 off)", table)
        self.assertIn("| PyTorch, 1 process on GPU 0 |", table)

    def test_table_and_json_carry_the_figures(self):
        results = self.dir / "results.jsonl"
        table = self.drive("--recipe", "pytorch-example", "--seeds", "3", "--pytorch-ranks", "1",
                           "--json", str(results))
        ours_row = next(line for line in table.splitlines() if line.startswith("| mnist_mt"))
        self.assertIn("20.0 (10.0–30.0, sd 10.0)", ours_row)     # time to target over seeds 1..3
        self.assertIn("99.20 (99.10–99.30", ours_row)             # final accuracy
        theirs_row = next(line for line in table.splitlines() if line.startswith("| PyTorch, 1 process"))
        self.assertIn("40.0 (20.0–60.0", theirs_row)
        self.assertIn("mnist_mt / PyTorch's best (PyTorch, 1 process x 2 threads), mean time to target: 0.50×",
                      table)
        self.assertIn("--optimizer adadelta", table)
        self.assertIn("Machine: ", table)
        record = json.loads(results.read_text())
        self.assertEqual(record["seeds"], [1, 2, 3])
        self.assertEqual(len(record["runs"]["mnist_mt"]), 3)
        self.assertEqual(record["torch"]["torch_version"], "fake")

    def test_a_batch_that_does_not_split_is_refused(self):
        done = subprocess.run([sys.executable, str(DRIVER), "--recipe", "template", "--cores", "3",
                               "--skip-pytorch", "--build", str(self.dir / "build")],
                              capture_output=True, text=True, timeout=60)
        self.assertNotEqual(done.returncode, 0)
        self.assertIn("must divide", done.stderr)
        self.assertFalse(self.ours_log.exists())


@unittest.skipUnless(subprocess.run([TORCH_PYTHON, "-c", "import torch"], capture_output=True).returncode == 0,
                     f"{TORCH_PYTHON} has no torch")
class Recipe(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.data = Path(cls.tmp.name)
        random_mnist(cls.data, train=512, test=200)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def recipe(self, *args):
        command = [TORCH_PYTHON, str(RECIPE), "--data", str(self.data), "--threads", "2", *args]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        self.assertEqual(done.returncode, 0, shlex.join(command) + "\n" + done.stderr)
        return json.loads(done.stdout.splitlines()[-1])

    def test_evaluations_every_n_steps_and_at_epoch_ends(self):
        result = self.recipe("--optimizer", "adamw", "--lr-schedule", "onecycle", "--batch-size", "64",
                             "--epochs", "2", "--eval-every", "3", "--warmup", "2")
        self.assertEqual(result["steps_per_epoch"], 8)       # 512 // 64, the last partial batch dropped
        self.assertEqual([e["step"] for e in result["evals"]], [3, 6, 8, 9, 12, 15, 16])
        self.assertIsNone(result["time_to_target_s"])
        self.assertGreater(result["images_per_s"], 0)

    def test_a_target_stops_at_the_first_evaluation_reaching_it(self):
        result = self.recipe("--recipe", "pytorch-example", "--batch-size", "32", "--eval-every", "5",
                             "--target-accuracy", "0")
        self.assertEqual(result["target_step"], 5)
        self.assertEqual(result["steps"], 5)
        self.assertEqual(result["settings"]["optimizer"], "adadelta")
        self.assertGreaterEqual(result["time_to_target_s"], result["eval_seconds"])

    def test_cuda_runs_one_process_on_the_gpu_or_is_refused(self):
        command = [TORCH_PYTHON, str(RECIPE), "--data", str(self.data), "--recipe", "fast", "--epochs", "1"]
        two = subprocess.run(command + ["--device", "cuda", "--ranks", "2"], capture_output=True, text=True,
                             timeout=120)
        self.assertEqual(two.returncode, 2)
        self.assertIn("--device cuda runs one process", two.stderr)
        has_gpu = subprocess.run([TORCH_PYTHON, "-c", "import sys, torch; sys.exit(not torch.cuda.is_available())"],
                                 capture_output=True).returncode == 0
        if has_gpu:
            result = self.recipe("--recipe", "fast", "--epochs", "1", "--device", "cuda")
            self.assertEqual(result["device"], "cuda")
            self.assertEqual(result["steps"], 512 // 128)
        else:
            one = subprocess.run(command + ["--device", "cuda"], capture_output=True, text=True, timeout=120)
            self.assertEqual(one.returncode, 2)
            self.assertIn("sees no CUDA device", one.stderr)

    def test_ddp_over_two_processes_takes_the_same_steps(self):
        result = self.recipe("--recipe", "fast", "--ranks", "2", "--epochs", "1")
        self.assertEqual(result["global_batch"], 128)
        self.assertEqual(result["steps"], 512 // 128)
        self.assertIn("DDP", result["layout"])


if __name__ == "__main__":
    unittest.main()
