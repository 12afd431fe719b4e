"""`workbench calibrate --ray` end to end (issue 26): the command starts a local Ray instance of its own (this module
initialises none), shows the cells' progress on stderr, writes the calibration record from the store its workers
filled, shuts the instance down, and a second run over the same store runs no cell again."""

import json
import socket

import pytest

from workbench.cli import main
from workbench.evidence.fanout import Store

ray = pytest.importorskip("ray")


def test_cli_calibrate_over_ray_writes_its_record_and_a_rerun_resumes_from_the_store(tmp_path, capsys):
    out, suite = tmp_path / "cal", tmp_path / "suite.json"
    case = {"prompt": "a red circle moves left", "frames": 5, "height": 16, "width": 16, "steps": 4, "mode": "t2v"}
    # test seeds on which the knee (0.5) skips a step of this random model (on 44 it skips none: not_executed)
    cases = {"calibration": [{**case, "seed": 42}], "test": [{**case, "seed": 43}, {**case, "seed": 45}]}
    suite.write_text(json.dumps({"name": "ray-cli", "version": 1, "model": "tiny-wan", "description": "", **cases}))
    budget = {"latent_rel_l2": 0.5, "psnr_db": None, "min_ssim": None}
    argv = ["calibrate", "--model", "tiny-wan", "--suite", str(suite), "--plugin", "easycache",
            "--budget", json.dumps(budget), "--max-evals", "3", "--base-profile", "stock", "--device", "cpu",
            "--ray", "--workers", "1", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "cells" in err and "worker 0" in err, err[-2000:]  # the command line's progress (TqdmView)
    assert not ray.is_initialized()  # the instance the command started is gone
    record = json.loads((out / "calibration.json").read_text())
    assert record["plugin"] == "easycache" and record["budget"]["latent_rel_l2"] == 0.5
    assert record["status"] == "quality_confirmed", record["reason"]  # searched in one cell, confirmed in two
    entries = Store(out / "cells").entries()
    assert len(entries) == 3 and all(e["status"] == "finished" and e["worker"]["host"] for e in entries.values())
    assert main(argv) == 0  # the same store: every cell is done, so nothing runs again
    assert Store(out / "cells").entries() == entries
    again = json.loads((out / "calibration.json").read_text())
    assert [p["value"] for p in again["points"]] == [p["value"] for p in record["points"]]
    assert again["status"] == record["status"]


def test_cli_ray_malformed_address_is_refused_under_ray(tmp_path, capsys):
    argv = ["batch", "--model", "tiny-wan", "--requests", "data_manifests/tiny-smoke.json", "--out", str(tmp_path)]
    assert main([*argv, "--ray", "garbage"]) == 2
    err = capsys.readouterr().err
    assert "error: --ray: 'garbage': Invalid address format: garbage; allowed: 'auto', a cluster's host:port" in err
    assert not ray.is_initialized()


def test_cli_ray_address_where_nothing_answers_is_refused_before_ray_init(tmp_path, capsys):
    """`ray.init` would retry such an address for minutes; the probe refuses it first, for both address forms."""
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = ["batch", "--model", "tiny-wan", "--requests", "data_manifests/tiny-smoke.json", "--out", str(tmp_path)]
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        assert main([*argv, "--ray", address]) == 2
        err = capsys.readouterr().err
        assert f"error: --ray: '{address}': nothing answers at 127.0.0.1:{port} within 10 s (" in err, err
        assert "allowed: 'auto', a cluster's host:port" in err
        assert not ray.is_initialized()
