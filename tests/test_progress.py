"""Progress bars are text on stdout (they survive a reopened notebook), off under TQDM_DISABLE."""

import time

import IPython.display
from diffusers.utils import logging as diffusers_logging
from transformers.utils import logging as transformers_logging

import workbench.progress
from workbench.progress import library_bars_off, progress


def test_progress_is_text_on_stdout_once_it_has_run_half_a_second(capsys, monkeypatch):
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    assert list(progress(range(3), 3, "quick")) == [0, 1, 2]
    assert capsys.readouterr() == ("", "")  # a loop shorter than the delay shows nothing
    for _ in progress(range(3), 3, "slow requests"):
        time.sleep(0.3)
    out, err = capsys.readouterr()
    assert "slow requests: 100%" in out and "3/3" in out and err == ""


def test_progress_honours_tqdm_disable_and_enabled(capsys, monkeypatch):
    monkeypatch.setenv("TQDM_DISABLE", "1")
    with progress(total=2, desc="x") as bar:
        time.sleep(0.6)
        bar.update(2)
    monkeypatch.delenv("TQDM_DISABLE")
    for _ in progress(range(2), 2, "y", enabled=False):
        time.sleep(0.3)
    assert capsys.readouterr() == ("", "")


def test_library_bars_off_restores_the_libraries_state():
    assert diffusers_logging.is_progress_bar_enabled() and transformers_logging.is_progress_bar_enabled()
    with library_bars_off():
        assert not diffusers_logging.is_progress_bar_enabled()
        assert not transformers_logging.is_progress_bar_enabled()
    assert diffusers_logging.is_progress_bar_enabled() and transformers_logging.is_progress_bar_enabled()


def test_in_a_kernel_the_bar_is_one_display_output_updated_in_place(capsys, monkeypatch):
    """A headless run (papermill) keeps every stream message as an output line; a display updated in place is kept
    as one output, the bar's last line."""
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    monkeypatch.setattr(workbench.progress, "_in_kernel", lambda: True)
    shown = []

    class Handle:
        def update(self, bundle, raw):
            shown[-1] = bundle["text/plain"]

    def display(bundle, raw, display_id):
        assert raw and display_id and not shown  # one output, made once
        shown.append(bundle["text/plain"])
        return Handle()

    monkeypatch.setattr(IPython.display, "display", display)
    for _ in progress(range(4), 4, "denoise steps"):
        time.sleep(0.2)
    assert len(shown) == 1 and shown[0].startswith("denoise steps: 100%") and "4/4" in shown[0]
    assert "\r" not in shown[0] and "█" in shown[0]
    assert capsys.readouterr() == ("", "")
