"""The README's commands are real: set-up lines, CLI examples and the Python API example."""

import os
import re
import shlex

import pytest

from tf_spectrain.app import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
BLOCKS = re.findall(r"```(\w*)\n(.*?)```", README, flags=re.S)


def test_readme_starts_with_exactly_two_set_up_commands():
    lang, first = BLOCKS[0]
    lines = [line for line in first.strip().splitlines() if line.strip()]
    assert lang == "bash" and len(lines) == 2
    assert lines[0] == "pip install -e . && python train.py --model vgg16 --gpus 4"
    assert lines[1] == 'pip install -e ".[test]" && python -m pytest'


def test_ci_runs_the_readme_test_command():
    test_command = BLOCKS[0][1].strip().splitlines()[1]
    ci = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read()
    assert test_command in ci.splitlines()


def cli_examples():
    for lang, block in BLOCKS:
        for line in block.splitlines():
            line = line.split("#")[0].strip()
            if lang == "bash" and line.startswith("python train.py"):
                yield line


EXAMPLES = [line for line in cli_examples() if "--data-dir" not in line and "--help" not in line]


def test_readme_has_cli_examples():
    assert len(EXAMPLES) >= 5


@pytest.mark.parametrize("line", EXAMPLES)
def test_readme_cli_examples_parse(line, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # parsing creates the output dirs
    argv = shlex.split(line)[2:]
    args = cli.parse_args(argv)  # exits with code 2 on any bad flag
    assert args.model


NEEDS = "# needs running workers"  # marks the several-hosts example


def test_the_several_hosts_example_is_what_the_remote_pipeline_test_runs():
    # It cannot run here (it needs workers on those hosts); the test with workers on
    # 127.0.0.1 (tests/remote_pipeline_child.py) makes the same calls.
    (block,) = [b for lang, b in BLOCKS if lang == "python" and NEEDS in b]
    child = open(os.path.join(ROOT, "tests", "remote_pipeline_child.py")).read()
    assert "tf_spectrain.connect_cluster(" in block and "connect_cluster(args.cluster" in child
    assert "PipelineModel(model, devices=devices)" in block
    assert "PipelineModel(model, cuts=" in child and "devices=devices" in child


def test_readme_python_examples_run(tmp_path, monkeypatch):
    """The API example, then the resume and trace examples, run one after the other."""
    code = "\n".join(block for lang, block in BLOCKS if lang == "python" and NEEDS not in block)
    # The same code on a small model and a slice of the data, so that it runs in seconds.
    replacements = [
        ('get_model("vgg16"', 'get_model("small_cnn"'),
        ('["block2_pool", "block3_pool", "block4_pool"]', '["pool1", "flatten", "fc1"]'),
        ('load_arrays("digits", "train")', 'load_arrays("digits", "train", limit=96)'),
        ('load_arrays("digits", "test")', 'load_arrays("digits", "test", limit=32)'),
    ]
    for old, new in replacements:
        assert old in code, f"README example changed: {old!r} not found"
        code = code.replace(old, new)
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(compile(code, "README.md", "exec"), namespace)
    assert len(namespace["history"].history["loss"]) == 2
    assert (tmp_path / "trained.keras").exists()
    assert any(name.startswith("events") for _, _, files in os.walk(tmp_path / "runs")
               for name in files)
    assert namespace["info"]["epoch"] == 2  # the resume example continued after epoch 2
    # ... and the trace example trained epoch 3 with a PipelineTrace: 4 epochs of 96 / 64.
    assert namespace["pipe"].stage_optimizers[0].iterations.numpy() == 4 * 2
    assert (tmp_path / "runs" / "api" / "trace" / "trace_epoch_3.json").exists()
