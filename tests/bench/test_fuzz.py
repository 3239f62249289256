"""bench/fuzz.py: random torch programs through the whole compiler, checked on the emulator."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from fuzz import Gen, main  # noqa: E402


@pytest.mark.parametrize("seed", range(40))
def test_generated_programs_have_the_shapes_the_generator_tracks(seed):
    rng = random.Random(seed)
    node = Gen(rng, rng.choice(["", ".half()"])).program(rng.randint(1, 7))
    value = eval(node.code, {"torch": torch, "F": F})  # noqa: S307 - our own generator's text
    assert tuple(value.shape) == node.shape, node.code


def test_products_keep_their_weights_within_max_elements():
    """x @ w over large axes: the weight (and the result) no larger than --max-elements, as the
    inputs are (a 5,000 x 5,000 weight had kept the emulator past its time limit)."""
    import math
    import re

    gen = Gen(random.Random(0), "", dims=(1, 3, 17, 100, 1000, 5000), max_elements=60000)
    for _ in range(200):
        node = gen.matmul(gen.leaf())
        for shape in re.findall(r"torch\.randn\(([\d, ]+)\)", node.code):
            assert math.prod(int(d) for d in re.findall(r"\d+", shape)) <= 60000, node.code
        assert math.prod(node.shape) <= 60000, node.code


def test_a_few_programs_pass(capsys):
    assert main(["--programs", "3", "--seed", "5", "--rows", "0"]) == 0
    out = capsys.readouterr().out
    assert "programs: ok 3, refused 0, failed 0" in out


@pytest.mark.parametrize("args", [["--programs", "0"], ["--half", "2"], ["--rows", "x"],
                                  ["--dims", "1,2"], ["--dims", "a,b,c,d"],
                                  ["--max-elements", "10"]])
def test_bad_arguments_are_a_message_and_exit_code_2(args):
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "fuzz.py"), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_fifty_programs_with_sampled_rows_pass():
    assert main(["--programs", "50", "--seed", "2", "--rows", "2", "--depth", "7",
                 "--half", "0.4"]) == 0
