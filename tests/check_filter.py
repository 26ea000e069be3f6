#!/usr/bin/env python3
"""A GoogleTest filter that a test of its own runs selects as many tests as it should.

usage: check_filter.py BINARY FILTER COUNT

GoogleTest passes a run whose filter matches nothing; a test that runs part of a binary
by name (test_trainer_ranks) would then pass after a rename, having run nothing.
"""
import subprocess
import sys


def main() -> int:
    binary, pattern, want = sys.argv[1], sys.argv[2], int(sys.argv[3])
    listed = subprocess.run([binary, "--gtest_list_tests", "--gtest_filter=" + pattern],
                            capture_output=True, text=True, check=True).stdout
    # Suites end with '.', their tests are indented below them.
    names = [line.strip() for line in listed.splitlines() if line.startswith("  ")]
    if len(names) != want:
        print(f"{binary}: --gtest_filter={pattern} selects {len(names)} tests ({', '.join(names) or 'none'}), "
              f"not {want}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
