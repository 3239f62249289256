"""bench/dequant_sass.py: bad input is a message and exit code 2, before any compile."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("argv,message", [
    (["--json", "/no/such/dir/counts.json"], "no directory /no/such/dir"),
    (["--rows", "2"], "unrecognized arguments: --rows 2"),
], ids=["json_dir", "flag"])
def test_bad_input_is_a_message_and_exit_code_2(argv, message):
    proc = subprocess.run([sys.executable, "bench/dequant_sass.py", *argv],
                          capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
