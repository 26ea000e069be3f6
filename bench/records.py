"""The JSON-lines result files of bench/results/, as the bench scripts read them."""
import json
import sys


def read_records(path, prog):
    """Every record of `path`; ends the program `prog` with one line when it has none or
    cannot be read."""
    try:
        with open(path) as f:
            records = [json.loads(line) for line in f if line.strip()]
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"{prog}: {path}: {e}")
    if not records:
        sys.exit(f"{prog}: {path}: no records")
    return records
