import json

from workbench.cli import main


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
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert f"video:  {out / 'result.mp4'}" in printed
    record = json.loads((out / "result.json").read_text())
    assert record["metadata"]["request"]["frames"] == 9 and record["timings"]["denoise"] > 0


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


def test_cli_generate_bad_accelerations_write_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    args = ["generate", "--model", "tiny-wan", "--prompt", "p", "--out", str(out)]
    assert main([*args, "--accelerate", "[1]"]) == 2
    assert "--accelerate: expected a JSON object, got list" in capsys.readouterr().err
    assert main([*args, "--accelerate", '{"no_such_plugin": {}}']) == 2
    assert "no_such_plugin" in capsys.readouterr().err
    assert not out.exists()
