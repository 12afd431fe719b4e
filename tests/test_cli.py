import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.cli import main
from workbench.session import Session


def test_cli_generate_writes_video_report_and_record(tmp_path, capsys):
    out = tmp_path / "out"
    code = main(
        [
            "generate",
            "--model",
            "tiny-ltx2",
            "--prompt",
            "a red circle",
            "--frames",
            "9",
            "--height",
            "64",
            "--width",
            "64",
            "--steps",
            "2",
            "--seed",
            "0",
            "--out",
            str(out),
            "--trace",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert f"video:  {out / 'result.mp4'}" in printed and f"trace:  {out / 'result.trace.json.gz'}" in printed
    record = json.loads((out / "result.json").read_text())
    assert record["metadata"]["request"]["frames"] == 9 and record["timings"]["denoise"] > 0
    assert record["metadata"]["traced"] and record["metadata"]["trace"]["top"]
    events = json.loads(gzip.decompress((out / "result.trace.json.gz").read_bytes()))["traceEvents"]
    assert {"denoise", "step 1", "video_decode", "audio_decode"} <= {e["name"] for e in events}


def test_cli_bad_input_writes_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["generate", "--model", "tiny-wan", "--prompt", "p", "--frames", "10", "--out", str(out)])
    assert code == 2
    assert "frames: 10 is not accepted" in capsys.readouterr().err
    assert not out.exists()
    assert main(["generate", "--model", "nope", "--prompt", "p", "--out", str(out)]) == 2
    assert not out.exists()


def test_cli_info_lists_families(capsys):
    assert main(["info"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert set(info["families"]) >= {"wan", "ltx2"} and info["versions"]["diffusers"] == "0.42.1"


def test_cli_generate_with_profile_and_accelerations(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    out = tmp_path / "out"
    args = ["generate", "--model", "tiny-wan", "--prompt", "p", "--frames", "9", "--height", "32", "--width", "32"]
    args += ["--steps", "2", "--profile", "exact-fast", "--accelerate", '{"pyramid_attention_broadcast": {}}']
    assert main([*args, "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "fused_block_norms left out (Triton kernels on a CPU need TRITON_INTERPRET=1)" in err
    receipts = json.loads((out / "result.json").read_text())["receipts"]
    assert {"adaln_precompute", "cross_kv_cache", "pyramid_attention_broadcast"} <= set(receipts)
    # a cache asked for by name that cannot reuse a step at 2 steps (2 warm-up + 1 final dense) is named as idle
    cache = ["--accelerate", '{"easycache": {"threshold": 0.1}}', "--name", "cached"]
    assert main([*args[:-2], *cache, "--out", str(out)]) == 0
    assert "warning: easycache did no work at this request (receipt executed=false)" in capsys.readouterr().err


def test_cli_generate_bad_accelerations_write_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    args = ["generate", "--model", "tiny-wan", "--prompt", "p", "--out", str(out)]
    assert main([*args, "--accelerate", "[1]"]) == 2
    assert "--accelerate: expected a JSON object, got list" in capsys.readouterr().err
    assert main([*args, "--accelerate", '{"no_such_plugin": {}}']) == 2
    assert "no_such_plugin" in capsys.readouterr().err
    assert not out.exists()


def test_cli_generate_fuses_adapters_given_as_a_path_or_json(tmp_path, capsys):
    from tests.test_adapters import lora_file
    from workbench.models import wan

    lora = lora_file(tmp_path / "style.safetensors", wan.tiny().pipeline.transformer, seed=5)
    out = tmp_path / "out"
    args = ["generate", "--model", "tiny-wan", "--prompt", "p", "--frames", "5", "--height", "32", "--width", "32"]
    args += ["--steps", "2", "--out", str(out)]
    bad = [["--adapter", str(tmp_path / "none.safetensors")], ["--adapter", '{"path": "x", "strength": 2}']]
    for flags, message in zip(bad, ("is not an existing .safetensors file", "allowed: path (required)"), strict=True):
        assert main([*args, *flags]) == 2 and message in capsys.readouterr().err and not out.exists()
    given = ["--adapter", str(lora), "--adapter", json.dumps({"path": str(lora), "scale": -0.5, "name": "undo"})]
    assert main([*args, *given]) == 0
    fused = json.loads((out / "result.json").read_text())["metadata"]["adapters"]
    assert [(a["name"], a["scale"]) for a in fused] == [("style", 1.0), ("undo", -0.5)]


SUITE = Path(__file__).resolve().parents[1] / "data_manifests" / "tiny-smoke.json"
SUITE_ARGS = ["--model", "tiny-wan", "--suite", str(SUITE)]
COMMANDS = {
    "generate": ["generate", "--model", "tiny-wan", "--prompt", "p"],
    "qualify": ["qualify", *SUITE_ARGS, "--candidate", '{"cross_kv_cache": {}}'],
    "sweep": ["sweep", *SUITE_ARGS, "--plugin", "easycache", "--option", "threshold", "--values", "0,0.1"],
    "search": ["search", *SUITE_ARGS, "--candidates", '[{"cross_kv_cache": {}}]'],
    "train-tiny": ["train-tiny", "--device", "cpu", "--minutes", "0"],
}


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model (or training) fails the test: every refusal below must come before any of it."""

    def reached(*args, **kwargs):
        raise AssertionError("a model was loaded before the inputs were checked")

    monkeypatch.setattr(Session, "open", classmethod(reached))
    monkeypatch.setattr("workbench.training.train_tiny.train", reached)


def _one_line_error(capsys, command: str) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"workbench {command}: error: "), err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize("command", list(COMMANDS))
def test_cli_unwritable_out_exits_2_before_loading(command, tmp_path, capsys, no_model):
    blocker = tmp_path / "a-file"
    blocker.write_text("in the way")
    for out in (blocker, blocker / "sub"):  # a file where the folder goes, and a file as its parent
        assert main([*COMMANDS[command], "--out", str(out)]) == 2
        err = _one_line_error(capsys, command)
        assert f"--out: cannot write to {out}" in err
    assert blocker.read_text() == "in the way"


@pytest.mark.parametrize("command", ["qualify", "sweep", "search"])
def test_cli_bad_suite_exits_2_naming_the_file(command, tmp_path, capsys, no_model):
    out = tmp_path / "out"
    args = [a if a != str(SUITE) else str(tmp_path / "missing.json") for a in COMMANDS[command]]
    assert main([*args, "--out", str(out)]) == 2
    assert f"suite: cannot read {tmp_path / 'missing.json'} (No such file" in _one_line_error(capsys, command)
    torn = tmp_path / "suite.json"
    torn.write_text(SUITE.read_text() + "\n{}")
    args = [a if a != str(SUITE) else str(torn) for a in COMMANDS[command]]
    assert main([*args, "--out", str(out)]) == 2
    assert re.search(rf"suite: {re.escape(str(torn))}: Extra data at line \d+", _one_line_error(capsys, command))
    torn.write_text("[" * 100_000 + "]" * 100_000)  # deeper than the parser goes: the file is still named
    assert main([*args, "--out", str(out)]) == 2
    assert f"suite: {torn} is not valid JSON (nested too deeply)" in _one_line_error(capsys, command)
    assert not out.exists()


@pytest.mark.parametrize("command", ["qualify", "sweep", "search"])
def test_cli_suite_pinned_to_another_model_needs_allow_other_model(command, tmp_path, capsys, no_model):
    args = [a if a != "tiny-wan" else "tiny-ltx2" for a in COMMANDS[command]]
    assert main([*args, "--out", str(tmp_path / "out")]) == 2
    assert "pinned to 'tiny-wan', got 'tiny-ltx2'" in _one_line_error(capsys, command)
    with pytest.raises(AssertionError, match="a model was loaded"):  # allowed: it goes on to load the model
        main([*args, "--allow-other-model", "--out", str(tmp_path / "out")])


@pytest.mark.parametrize(
    ("command", "flag", "value"),
    [
        ("generate", "--accelerate", '{"cross_kv_cache": {}} trailing'),
        ("qualify", "--candidate", '{"cross_kv_cache": {}}}'),
        ("qualify", "--baseline", "{} {}"),
        ("sweep", "--base", '{"threshold": 0.1} x'),
        ("sweep", "--budget", "{"),
        ("search", "--candidates", '[{"cross_kv_cache": {}}] ]'),
        pytest.param("generate", "--accelerate", "[" * 100_000 + "]" * 100_000, id="accelerate-nested-too-deep"),
    ],
)
def test_cli_json_flags_that_do_not_parse_name_the_flag(command, flag, value, tmp_path, capsys, no_model):
    out = tmp_path / "out"
    assert main([*COMMANDS[command], flag, value, "--out", str(out)]) == 2
    assert f"error: {flag}: not valid JSON" in _one_line_error(capsys, command)
    assert not out.exists()


@pytest.mark.parametrize(
    ("command", "flags", "message"),
    [
        ("qualify", ["--candidate", '{"banana": {}}'], "--candidate: accelerations: unknown ['banana']"),
        ("qualify", ["--baseline", '{"easycache": {"threshold": -1}}'], "--baseline: easycache.threshold: -1.0"),
        ("qualify", ["--rounds", "0"], "--rounds: 0; allowed: an int of interleaved rounds"),
        ("sweep", ["--plugin", "banana"], "--plugin: unknown 'banana'"),
        ("sweep", ["--values", '"a",-1'], "--values: easycache.threshold: expected float, got str 'a'"),
        ("sweep", ["--base", '{"warmup": -3}'], "--base: easycache.warmup: -3 is below the minimum 0"),
        ("search", ["--candidates", '[{"banana": {}}]'], "--candidates[0]: accelerations: unknown ['banana']"),
        ("search", ["--rounds", "0"], "--rounds: 0; allowed"),
        ("calibrate", ["--rounds", "0"], "--rounds: 0; allowed"),
        ("calibrate", ["--plugin", "easycache"], "plugin: 'easycache' given more than once"),
        ("search", ["--candidates", '[{"cross_kv_cache": {}}, {"cross_kv_cache": {}}]'], "candidates[1]: repeats"),
        # JSON keeps the last of two equal keys: which one was meant is the user's to say
        (
            "generate",
            ["--accelerate", '{"easycache": {"threshold": 0.1, "threshold": 0.3}}'],
            "--accelerate: 'threshold' is given twice in one object",
        ),
        ("qualify", ["--budget", '{"psnr_db": 30, "psnr_db": 5}'], "--budget: 'psnr_db' is given twice in one object"),
        ("qualify", ["--budget", '{"psnr_db": 1%s}' % ("0" * 400)], "psnr_db: must be a finite number >= 0"),
        ("generate", ["--memory", "1" + "0" * 400], "--memory: '10000000000"),
        ("qualify", ["--budget", '{"psnr_db": "x"}'], "--budget: psnr_db: must be a finite number >= 0 or None"),
        ("sweep", ["--budget", '{"nope": 1}'], "--budget: unknown field(s) ['nope']; allowed: ['latent_rel_l2'"),
        ("calibrate", ["--budget", '{"psnr_db": -1}'], "--budget: psnr_db: must be a finite number >= 0"),
    ],
)
def test_cli_plugin_configs_and_rounds_are_refused_before_the_model_loads(
    command, flags, message, tmp_path, capsys, no_model
):
    out = tmp_path / "out"
    base = COMMANDS[command] if command in COMMANDS else ["calibrate", *SUITE_ARGS, "--plugin", "easycache"]
    assert main([*base, *flags, "--out", str(out)]) == 2
    assert message in _one_line_error(capsys, command)
    assert not out.exists()


@pytest.mark.parametrize("command", ["qualify", "sweep", "search", "calibrate"])
def test_cli_suite_case_the_model_cannot_take_is_refused_before_any_run(command, tmp_path, capsys, monkeypatch):
    """A case the loaded model refuses (frames its VAE does not take) is named before the first request runs, not
    after the cases before it ran (2 x rounds + 3 runs each, for every configuration)."""

    def ran(*args, **kwargs):
        raise AssertionError("a request ran before every case was checked")

    monkeypatch.setattr(Session, "generate", ran)
    suite = json.loads(SUITE.read_text())
    suite["test"][1]["frames"] = 10  # Wan takes 4n + 1 frames
    path = tmp_path / "suite.json"
    path.write_text(json.dumps(suite))
    base = COMMANDS.get(command, ["calibrate", *SUITE_ARGS, "--plugin", "easycache"])
    args = [a if a != str(SUITE) else str(path) for a in base]
    assert main([*args, "--out", str(tmp_path / "out")]) == 2
    assert "error: test[1]: frames: 10 is not accepted by the wan VAE" in _one_line_error(capsys, command)


@pytest.fixture
def no_ray(monkeypatch):
    """Touching Ray (starting or joining a cluster) fails the test."""

    def touched(*args, **kwargs):
        raise AssertionError("Ray was touched before the cases were checked")

    monkeypatch.setattr("workbench.evidence.fanout._ray", touched)


@pytest.mark.parametrize(
    ("command", "split", "index", "field", "value", "message"),
    [
        ("qualify", "test", 1, "frames", 10, "test[1]: frames: 10 is not accepted by the wan VAE"),
        ("sweep", "test", 1, "height", 72, "test[1]: height: 72 must be a multiple of 16 for wan"),
        ("search", "test", 0, "mode", "i2v", "test[0]: mode: 'i2v' is not supported by wan"),
        ("calibrate", "calibration", 1, "frames", 10, "calibration[1]: frames: 10 is not accepted by the wan VAE"),
        ("calibrate", "test", 1, "width", 40, "test[1]: width: 40 must be a multiple of 16 for wan"),
        ("batch", "test", 1, "frames", 10, "--requests[1]: frames: 10 is not accepted by the wan VAE"),
    ],
)
def test_cli_ray_refuses_a_case_the_model_cannot_take_before_ray_starts(
    command, split, index, field, value, message, tmp_path, capsys, no_model, no_ray
):
    """With --ray, a case the model refuses is named on the driver as without Ray (`test[1]: ...`), from the model's
    shapes (no weight loaded, no Ray touched), where it was found on a worker once the cluster had started; a suite
    the model takes goes on to Ray."""
    suite = json.loads(SUITE.read_text())
    suite[split][index][field] = value
    path = tmp_path / "suite.json"
    path.write_text(json.dumps(suite))
    base = {
        **COMMANDS,
        "calibrate": ["calibrate", *SUITE_ARGS, "--plugin", "easycache"],
        "batch": ["batch", "--model", "tiny-wan", "--requests", str(SUITE)],
    }[command]
    args = [*(a if a != str(SUITE) else str(path) for a in base), "--ray", "--out", str(tmp_path / "out")]
    assert main(args) == 2
    assert f"error: {message}" in _one_line_error(capsys, command)
    with pytest.raises(AssertionError, match="Ray was touched"):  # the shipped suite passes the check
        main([*base, "--ray", "--out", str(tmp_path / "out")])


def test_cli_ray_cases_of_a_model_the_driver_cannot_build_are_left_to_the_workers(tmp_path, capsys, no_model, no_ray):
    """A folder this machine does not hold may be the Ray workers' (a cluster's ADDRESS): its cases are checked on a
    worker once loaded, as before; a model the driver builds is checked here whichever cluster runs it."""
    suite = json.loads(SUITE.read_text())
    suite["test"][1]["frames"] = 10
    (tmp_path / "suite.json").write_text(json.dumps(suite))
    args = ["batch", "--requests", str(tmp_path / "suite.json"), "--out", str(tmp_path / "out")]
    with pytest.raises(AssertionError, match="Ray was touched"):
        main([*args, "--model", str(tmp_path / "model-on-the-workers"), "--ray", "auto"])
    assert main([*args, "--model", "tiny-wan", "--ray", "auto"]) == 2
    assert "requests[1]: frames: 10 is not accepted" in _one_line_error(capsys, "batch")


@pytest.mark.parametrize(
    ("command", "flags", "message"),
    [
        ("generate", ["--memory", "-5GiB"], "--memory: '-5GiB' is not an amount of memory; allowed: a positive int"),
        ("generate", ["--guidance", "-1e-3"], "--guidance: -0.001 is out of range; allowed: finite numbers in [0.0,"),
        ("generate", ["--guidance", "-inf"], "--guidance: -inf is out of range; allowed: finite numbers"),
        ("generate", ["--seed", "-1"], "--seed: -1 is out of range; allowed: integers in [0,"),
        ("generate", ["--frames", "10"], "--frames: 10 is not accepted by the wan VAE; allowed: 4*n + 1"),
        ("qualify", ["--ray", "--memory", "-5GiB"], "--memory: '-5GiB' is not an amount of memory; allowed:"),
        ("qualify", ["--ray", "--workers", "-2"], "--workers: -2; allowed: an integer >= 1"),
        ("sweep", ["--values", "-1e-3"], "--values: easycache.threshold: -0.001 is below the minimum 0.0"),
        ("calibrate", ["--margin", "-1e-3"], "--margin: -0.001; allowed: a number in (0, 1]"),
        ("calibrate", ["--max-seconds", "-1e3"], "--max-seconds: -1000.0; allowed: seconds >= 0"),
        ("qualify", ["--max-seconds", "-1e3"], "--max-seconds: -1000.0; allowed: seconds >= 0"),
        ("search", ["--ray", "--max-seconds", "5"], "--max-seconds: not with --ray (stop it with Ctrl-C: its --store"),
        ("train-tiny", ["--vocoder-lr", "-1e-4"], "--vocoder-lr: -0.0001; allowed: a finite number > 0"),
    ],
)
def test_cli_a_negative_value_given_apart_is_refused_under_its_flag(
    command, flags, message, tmp_path, capsys, no_model, no_ray
):
    """`--memory -5GiB` is the flag's value, as `--memory=-5GiB` is (argparse took every dash-led word but -5 and -.5
    for an option: `expected one argument`, nothing of what is allowed); either way the error names the flag, where
    a library check names its field (`seed: ...`, `workers: ...`, `vocoder_lr: ...`)."""
    base = COMMANDS.get(command, ["calibrate", *SUITE_ARGS, "--plugin", "easycache"])
    *before, flag, value = flags
    for given in ([flag, value], [f"{flag}={value}"]):
        assert main([*base, *before, *given, "--out", str(tmp_path / "out")]) == 2
        assert message in _one_line_error(capsys, command)


@pytest.mark.parametrize(
    ("command", "flags", "message"),
    [
        ("generate", ["--gpus", "0"], "--gpus: expected a positive int"),
        ("generate", ["--device", "foo"], "--device: 'foo' is not a device; allowed: auto, cpu, cuda, cuda:N"),
        ("generate", ["--dtype", "int8"], "--dtype: 'int8'; allowed: ['bfloat16', 'float16', 'float32']"),
        ("generate", ["--adapter", '{"path": 5}'], "--adapter: path: 5; allowed: a str or pathlib.Path"),
        ("qualify", ["--suite", "no-such-suite.json"], "--suite: cannot read no-such-suite.json"),
    ],
)
def test_cli_a_library_check_naming_its_field_is_said_under_the_flag(command, flags, message, tmp_path, capsys):
    """The library names its field (`gpus: ...`, `adapter.path: ...`); the command line says its flag instead."""
    assert main([*COMMANDS[command], *flags, "--out", str(tmp_path / "out")]) == 2
    assert f"error: {message}" in _one_line_error(capsys, command)


def test_cli_an_arm_equal_to_the_baseline_is_noted_as_an_a_a_run_before_the_model_loads(tmp_path, capsys, no_model):
    runs = {
        "qualify": (["--candidate", "{}"], ["--candidate"]),
        "search": (["--candidates", '[{"cross_kv_cache": {}}, {}]', "--baseline", "{}"], ["--candidates[1]"]),
    }
    for command, (flags, noted) in runs.items():
        with pytest.raises(AssertionError, match="a model was loaded"):
            main([command, *SUITE_ARGS, *flags, "--out", str(tmp_path / command)])
        notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note: ")]
        assert notes == [f"note: {flag} is the baseline ({{}}): an A/A run, it measures the noise" for flag in noted]


def test_cli_a_dash_led_prompt_given_apart_is_shown_how_to_write_it(capsys):
    """argparse reads `-dog` as a flag and says only that --prompt has no value; the message adds how to write it.
    An argparse refusal is one line like every other (no usage block), pointing at the command's --help."""
    with pytest.raises(SystemExit) as refused:
        main(["generate", "--prompt", "-dog", "--out", "out"])
    assert refused.value.code == 2 and capsys.readouterr().err == (
        "workbench generate: error: argument --prompt: expected one argument; a value that starts with '-' goes "
        "after '=': --prompt=-dog (see workbench generate --help)\n"
    )
    with pytest.raises(SystemExit):
        main(["generate", "--prompt", "p", "--out"])  # a missing value: no such hint
    assert capsys.readouterr().err == (
        "workbench generate: error: argument --out: expected one argument (see workbench generate --help)\n"
    )


def test_cli_flags_are_matched_whole_never_by_prefix(tmp_path, capsys, no_model):
    """`--mode` is no flag of generate: argparse's prefix matching read `--mode i2v` as `--model i2v`, so a later
    `--model` dropped it without a word (and an earlier one was replaced by a model named 'i2v')."""
    for words in (["--mode", "i2v", "--model", "tiny-wan"], ["--model", "tiny-wan", "--mode", "i2v"]):
        with pytest.raises(SystemExit) as refused:
            main(["generate", *words, "--prompt", "p", "--out", str(tmp_path / "o")])
        assert refused.value.code == 2 and "unrecognized arguments: --mode i2v" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_cli_generate_output_names_are_refused_before_the_model_loads(tmp_path, capsys, no_model):
    """An empty --out (it would be the current directory), a --name with a folder part, too long or not UTF-8 text,
    and a folder where one of the outputs goes (publishing onto it would fail after the set's commit point) are
    refused in one line before loading, with nothing written; a card's name is a --memory cap."""
    base = COMMANDS["generate"]
    with pytest.raises(SystemExit) as refused:
        main([*base, "--out", ""])
    assert refused.value.code == 2 and "argument --out: empty path; give a directory" in capsys.readouterr().err
    out = tmp_path / "out"
    assert main([*base, "--out", str(out), "--name", "../escape"]) == 2
    assert "--name: must be a plain file stem" in _one_line_error(capsys, "generate") and not out.exists()
    assert main([*base, "--out", str(out), "--name", "a" * 300]) == 2  # longer than a file name may be
    assert "--name: 'aaaaaaaaaaaaaaaaaaaaaaaa'... is 300 bytes, too long" in _one_line_error(capsys, "generate")
    assert not out.exists()
    assert main([*base, "--out", str(out), "--name", "a\udc80"]) == 2  # $'a\x80': a byte UTF-8 cannot decode
    assert "--name: 'a\\udc80' holds '\\udc80', which UTF-8 cannot encode" in _one_line_error(capsys, "generate")
    assert not out.exists()
    (out / "result.json").mkdir(parents=True)
    assert main([*base, "--out", str(out)]) == 2
    assert f"--out: {out / 'result.json'} exists and is not a regular file" in _one_line_error(capsys, "generate")
    assert sorted(p.name for p in out.iterdir()) == ["result.json"]
    with pytest.raises(AssertionError, match="a model was loaded"):  # accepted: it goes on to load the model
        main([*base, "--out", str(out), "--name", "capped", "--memory", "rtx4090"])


def test_cli_accelerate_options_are_refused_before_the_model_loads(tmp_path, capsys, no_model):
    """A bad option value, an unknown option or two conflicting plugins in --accelerate cost no model load."""
    out = tmp_path / "out"
    for value, message in (
        ('{"easycache": {"threshold": -1}}', "--accelerate: easycache.threshold: -1.0 is below the minimum 0.0"),
        ('{"easycache": {"thresh": 0.1}}', "--accelerate: easycache: unknown option(s) ['thresh']"),
        (
            '{"easycache": {"threshold": 0.1}, "teacache": {"rel_l1_thresh": 0.1}}',
            "'easycache' and 'teacache' are both",
        ),
    ):
        assert main([*COMMANDS["generate"], "--accelerate", value, "--out", str(out)]) == 2
        assert message in _one_line_error(capsys, "generate")
    assert not out.exists()


def test_cli_generate_refuses_a_malformed_calibration_record_before_loading(tmp_path, capsys, no_model):
    scope = {"model": "tiny-wan", "device": {"name": "cpu", "type": "cpu"}, "request": {}}
    good = {"kind": "calibration", "status": "calibrated", "setting": {"easycache": {"threshold": 0.1}}, "scope": scope}
    path = tmp_path / "calibration.json"
    args = [
        *COMMANDS["generate"],
        "--out",
        str(tmp_path / "o"),
        "--profile",
        "within-budget",
        "--calibration",
        str(path),
    ]
    cases = {
        "": "is not a readable JSON file",
        "[" * 100_000 + "]" * 100_000: f"{str(path)!r} is not a readable JSON file",  # deeper than the parser goes
        "[]": "expected a JSON object (a calibrate record), got list",
        json.dumps({k: v for k, v in good.items() if k != "scope"}): "'scope' must hold 'model', 'device'",
        json.dumps(good | {"setting": "oops"}): "'setting' must be an object of plugin -> options",
        json.dumps(good | {"status": "searched"}): "status 'searched'",
    }
    for text, message in cases.items():
        path.write_text(text)
        assert main(args) == 2
        assert message in _one_line_error(capsys, "generate").removeprefix("workbench generate: error: --calibration: ")
    for differs, message in (  # where it holds, as far as the model's shapes tell, before loading too
        ({"model": "tiny-ltx2"}, "record: calibrated for model 'tiny-ltx2', not 'tiny-wan'"),
        ({"device": {"name": "NVIDIA H200", "type": "cuda"}}, "record: calibrated on NVIDIA H200 (cuda), not "),
        ({"request": {"steps": 16}}, "record: holds for another request geometry: steps 16 (calibrated) vs "),
    ):
        path.write_text(json.dumps(good | {"scope": scope | differs}))
        assert main([*args, "--device", "cpu"]) == 2
        assert message in _one_line_error(capsys, "generate").removeprefix("workbench generate: error: --calibration: ")
    path.write_text(json.dumps(good))
    base = args[: args.index("--profile")]
    for alone, message in (  # each flag without the other, refused under the flag that was given
        (["--profile", "within-budget"], "error: --profile within-budget: needs --calibration RECORD"),
        (["--calibration", str(path)], "error: --calibration: goes with --profile within-budget only, not --profile "),
    ):
        assert main([*base, *alone]) == 2
        assert message in _one_line_error(capsys, "generate")
    with pytest.raises(AssertionError, match="a model was loaded"):  # it holds as far as the shapes tell
        main(args)


def test_cli_train_tiny_unwritable_pack_exits_2(tmp_path, capsys, no_model):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main([*COMMANDS["train-tiny"], "--out", str(tmp_path / "run"), "--pack", str(blocker / "p")]) == 2
    assert f"--pack: cannot write to {blocker / 'p'}" in _one_line_error(capsys, "train-tiny")
    assert not (tmp_path / "run").exists()


def test_cli_generate_memory_cap_refused_before_anything_runs(tmp_path, capsys):
    out = tmp_path / "out"
    base = ["generate", "--model", "tiny-wan", "--prompt", "p", "--out", str(out), "--memory"]
    assert main([*base, "lots"]) == 2
    assert "--memory: 'lots' is not an amount of memory" in capsys.readouterr().err
    assert main([*base, "1000"]) == 2
    smallest = re.search(r"the smallest cap that fits is .* \((\d+) bytes\)", capsys.readouterr().err)
    assert smallest is not None and not (out / "result.mp4").exists()
    assert main([*base[:-1], "--fp8-ring"]) == 2  # FP8 transfers belong to a cap's ring
    assert "--fp8-ring: FP8 transfers are how a memory cap's ring moves blocks" in capsys.readouterr().err
    # the budget takes FP8 transfers; tiny-wan's smallest plan streams no block (its two fit beside the slots), so
    # nothing moves as FP8 and the result stays exact (tests/test_memory_plan.py covers a plan that streams)
    assert main([*base, smallest[1], "--fp8-ring"]) == 0
    record = json.loads((out / "result.json").read_text())
    residency = record["receipts"]["memory_residency"]
    assert residency["options"]["ring_transfer"] == "fp8" and "blocks_streamed" not in residency
    assert record["exact"] is True and residency["contract"] == "bitwise"


def test_cli_ctrl_c_says_what_was_kept_and_the_command_that_goes_on(tmp_path, capsys, monkeypatch):
    """Ctrl-C (KeyboardInterrupt, wherever it hits) ends with status 130 and one line: without Ray, what the partial
    record keeps and the `--resume` command (tests/evidence/test_resume.py: qualify, sweep, search), or that nothing
    was recorded yet and the same command starts again; for a `--ray` run, the finished cells its store keeps. Never a
    bare traceback."""
    import shlex

    from workbench.evidence.resume import PARTIAL, Journal
    from workbench.evidence.store import Store

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(Session, "open", classmethod(interrupted))
    for command, unit in (("qualify", "case"), ("sweep", "(value, case) pair"), ("search", "(candidate, case) pair")):
        out = tmp_path / command
        assert main([*COMMANDS[command], "--out", str(out)]) == 130
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"workbench {command}: interrupted; no {unit} was recorded yet; nothing to continue")
        assert "Traceback" not in err and not out.exists()

    calibrate = ["calibrate", *SUITE_ARGS, "--plugin", "easycache", "--out", str(tmp_path / "cal")]
    assert main(calibrate) == 130
    assert "interrupted; no step was recorded yet" in capsys.readouterr().err

    def after_a_step(*args, **kwargs):  # the dense references and one point recorded, then Ctrl-C
        journal = Journal(tmp_path / "cal", "calibration", {}, 3, None)
        journal.steps.append({"kind": "point", "key": {}, "value": {}})
        journal._write("in progress: 1 step(s) recorded")
        raise KeyboardInterrupt

    monkeypatch.setattr(Session, "open", classmethod(after_a_step))
    assert main(calibrate) == 130
    err = capsys.readouterr().err.strip()
    assert f"interrupted; 1 step(s) recorded in {tmp_path / 'cal' / PARTIAL}; continue: workbench calibrate" in err
    assert shlex.split(err.split("continue: ")[1])[-2:] == ["--resume", str(tmp_path / "cal")]

    def cells(*args, **kwargs):  # two cells finished in the store, then Ctrl-C
        for key in ("ab" * 32, "cd" * 32):
            Store(tmp_path / "ray" / "cells").put({"key": key, "kind": "qualify", "label": "", "status": "finished"} |
                                                  {"record": {}, "outputs": None})  # fmt: skip
        raise KeyboardInterrupt

    monkeypatch.setattr("workbench.cli.evidence._fanout", cells)  # where sweep looks it up
    assert main([*COMMANDS["sweep"], "--ray", "--out", str(tmp_path / "ray")]) == 130
    err = capsys.readouterr().err.strip()
    assert f"the store {tmp_path / 'ray' / 'cells'} keeps 2 finished cell(s); the same command runs only" in err


def test_cli_a_run_into_an_out_holding_an_earlier_runs_record_says_it_replaces_them(tmp_path, capsys, no_model):
    """An --out that holds this command's record and report of an earlier run: a note before anything runs (the
    earlier files stay until this run ends, then are replaced whole)."""
    from workbench.evidence.fanout import Event, Progress, TqdmView

    for command, names in (("qualify", ["qualification.json"]), ("sweep", ["sweep.json", "sweep.html"])):
        out = tmp_path / command
        out.mkdir()
        for name in names:
            (out / name).write_text("{}")
        with pytest.raises(AssertionError, match="a model was loaded"):
            main([*COMMANDS[command], "--out", str(out)])
        shown = ", ".join(names)
        assert f"note: --out {out} holds {shown} of an earlier run; this run replaces them" in capsys.readouterr().err
    with pytest.raises(AssertionError, match="a model was loaded"):
        main([*COMMANDS["search"], "--out", str(tmp_path / "search")])
    assert "note:" not in capsys.readouterr().err
    view, progress = TqdmView(), Progress(5, [], skipped=3)  # a --ray re-run: what its store already holds
    view(Event("start", progress))
    view(Event("end", progress))
    assert "note: 3 of 5 cells already finished in the store: reused, not run again" in capsys.readouterr().err


def test_python_dash_m_workbench_is_the_command():
    done = subprocess.run([sys.executable, "-m", "workbench", "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: workbench ") and "generate" in done.stdout
