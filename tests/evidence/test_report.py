"""The static qualification report and result page: what they name they carry, offline (no script)."""

import base64
import html
import io
import re

import numpy as np
import pytest
import torch
from matplotlib.figure import Figure
from matplotlib.text import Text
from matplotlib.transforms import Bbox
from PIL import Image

from workbench import Request, Result, Session, environment
from workbench.environment import cpu_model_name
from workbench.evidence.report import ELEMENT_STYLES, WRAPPER_STYLE, Table, _png, fragment, render, video
from workbench.evidence.review import review_page
from workbench.plots import round_times
from workbench.quality import Budget, compare


def make_record(verdict: str, make_pair) -> tuple[dict, list]:
    """A qualification record as `qualify` writes it, with real quality metrics of two fake pilots."""
    a, b = make_pair()
    case = {
        "request": {"prompt": "a red circle moves left", "seed": 42},
        "verdict": verdict,
        "reason": "why",
        "speedup": {"median": 1.2345, "low": 1.1111, "high": 1.3333, "n_pairs": 3},
        "baseline_seconds": [1.0, 1.1, 0.9, 1.0],
        "candidate_seconds": [0.8, 0.85, 0.82],
        "warmup_seconds": {"baseline": 2.0, "candidate": 2.5},
        "timed_outputs_match_pilot": {"baseline": True, "candidate": True},
        "quality": compare(a, b).to_dict(),
        "receipts": {"cross_kv_cache": {"executed": True, "hits": 4}},
    }
    record = {
        "verdict": verdict,
        "cases": [case],
        "baseline": {},
        "candidate": {"cross_kv_cache": {}},
        "rounds": 3,
        "budget": Budget().to_dict(),
        "model": "tiny-wan",
        "git": {"commit": "f" * 40, "dirty": False},
        "device": environment.device_info(torch.device("cpu")),
    }
    return record, [(a, b)]


@pytest.fixture
def make_pair(rng):
    def make():
        frames = rng.integers(0, 256, (5, 32, 32, 3), dtype=np.uint8)
        noisy = np.clip(frames.astype(np.int16) + rng.integers(-3, 4, frames.shape), 0, 255).astype(np.uint8)
        return tuple(
            Result(frames=f, audio=None, sample_rate=None, fps=16, latents=None, timings={}, memory={})
            for f in (frames, noisy)
        )

    return make


@pytest.fixture
def exact_report(make_pair):
    record, pilots = make_record("no_speed_claim", make_pair)
    return record, render(record, pilots)


def pngs(page: str) -> list[Image.Image]:
    return [Image.open(io.BytesIO(base64.b64decode(d))) for d in re.findall(r"data:image/png;base64,([^\"']+)", page)]


def assert_readable(figure: Figure, shown_px: int, min_px: float = 12.0) -> None:
    """Shown `shown_px` wide (as its page shows it), every text of `figure` (point labels, ticks, legend, axis labels,
    title) is at least `min_px` tall, and no two texts written on its axes (the point labels) overlap."""
    px_per_point = shown_px / figure.get_figwidth() / 72
    sizes = sorted((t.get_fontsize() * px_per_point, t.get_text()) for t in figure.findobj(Text) if t.get_text())
    assert sizes[0][0] >= min_px, sizes[:3]
    figure.draw_without_rendering()
    boxes = [t.get_window_extent() for axes in figure.axes for t in axes.texts]
    assert boxes and not any(box.count_overlaps(boxes[:i]) for i, box in enumerate(boxes)), [
        t.get_text() for t in figure.axes[0].texts
    ]


def html_text(page: str) -> str:
    """The page's text as a reader sees it: tags dropped, entities unescaped."""
    return html.unescape(re.sub(r"<[^>]+>", " ", page))


def test_report_carries_round_and_quality_plots_as_png_data_uris(exact_report):
    record, page = exact_report
    assert "<script" not in page and "http" not in page.replace("http-equiv", "")  # nothing fetched
    assert "per-round request time of both arms" in page
    assert "per-frame PSNR and SSIM with the budget" in page
    images = pngs(page)
    assert len(images) == 2 and all(image.width >= 400 for image in images)


def test_a_notebook_shows_the_reports_body_with_its_look_inline(exact_report):
    """JupyterLab drops an untrusted output's <style> and shows its <title> as a stray line of text: notebooks 20, 40
    and 50 show `fragment` of the page, its body alone with the page's look in each element's style attribute."""
    record, qualification = exact_report
    for document in (qualification, review_page({"A": record})):
        shown = fragment(document)
        assert not re.search(r"<(!doctype|html|head|meta|title|style|body)\b", shown, re.IGNORECASE)
        body = document[document.index("<body>") + len("<body>") : document.rindex("</body>")]
        assert html_text(shown) == html_text(body)
        assert re.findall(r"</?(\w+)", shown) == re.findall(r"</?(\w+)", body)  # the same elements, in order
        assert re.findall(r"data:[^\"']+", shown) == re.findall(r"data:[^\"']+", body)  # the same videos and plots
        assert shown.startswith(f'<div class="vflash-report" style="{WRAPPER_STYLE}">')
        for tag, style in ELEMENT_STYLES.items():  # every styled element carries its rule, its own style after it
            styled = re.findall(rf'<{tag} style="{re.escape(style)}[;"]', shown)
            assert len(styled) == len(re.findall(rf"<{tag}\b", shown)), tag
        assert f'<th style="{ELEMENT_STYLES["th"]};text-align:left">' in shown
    shown = fragment(qualification)
    assert html_text(shown).split()[:2] == ["Qualification:", "no_speed_claim"]  # the <h1>: no <title> before it
    assert 'style="width:256px;height:256px;image-rendering:pixelated"' in shown  # a video's own style, kept
    with pytest.raises(ValueError, match=r"^document: expected a report page as `page` makes it"):
        fragment(html_text(qualification))


def test_report_labels_rounds_and_names_the_device(exact_report):
    record, page = exact_report
    for r in (1, 2, 3):
        assert f"{r}: A{r - 1} B{r} A{r}" in page
    assert f"{cpu_model_name()}, {record['device']['threads']} thread" in page
    assert re.search(r"<title>Qualification: no_speed_claim · \{&quot;cross_kv_cache&quot;: \{\}\} vs", page)


def test_report_videos_show_at_least_256_px_with_their_labels(exact_report):
    _, page = exact_report
    videos = re.findall(r"<video [^>]*style=\"width:(\d+)px;height:(\d+)px;image-rendering:pixelated\"", page)
    assert [(int(w), int(h)) for w, h in videos] == [(256, 256), (256, 256)]
    assert "baseline: 32x32 px, 5 frames @ 16 fps" in page and "candidate: 32x32 px" in page


def test_video_label_and_figure_caption_are_escaped(make_pair):
    """A label is any text (the review page labels a candidate's video with its JSON): quotes and markup in it
    must reach the reader as text, not end the tooltip attribute or open a tag."""
    label = '{"cross_kv_cache": {}} <b>'
    page = video(make_pair()[0], label) + _png(round_times([1.0, 1.1], [0.9]), 'A < B & "C"')
    assert 'title="{&quot;cross_kv_cache&quot;: {}} &lt;b&gt;"' in page
    assert "<figcaption>{&quot;cross_kv_cache&quot;: {}} &lt;b&gt;: 32x32 px" in page
    assert '<img alt="A &lt; B &amp; &quot;C&quot;"' in page
    assert "<figcaption>A &lt; B &amp; &quot;C&quot;</figcaption>" in page


def test_table_reads_as_html_in_a_notebook_and_as_aligned_text_in_a_terminal():
    columns = ["attribute", "expected", "detected", "match"]
    shown = Table({"colour": ("red", "blue", False), "shape <b>": ("circle", "circle", True)}, columns)
    page = shown._repr_html_()
    assert page.startswith('<table><tr><th style="text-align:left">attribute</th><th style="text-align:left">expected')
    assert '<tr><th style="text-align:left">shape &lt;b&gt;</th><td style="text-align:left">circle</td>' in page
    assert repr(shown).splitlines() == [
        "attribute  expected  detected  match",
        "---------  --------  --------  -----",
        "colour     red       blue      False",
        "shape <b>  circle    circle    True",
    ]
    assert repr(Table({"rate": 1 / 3, "count": 4})) == "rate   0.3333\ncount  4"  # no header: heading and value
    pairs = Table([("x", [None, 0.5]), ("x", ["b", 2])], ["value", "a", "b"])  # headings repeat; None: nothing
    assert repr(pairs).splitlines()[2:] == ["x         0.5", "x      b  2"]
    with pytest.raises(ValueError, match="row 'colour': 1 cells for 3 columns"):
        Table({"colour": ("red",)}, columns)


def test_not_executed_report_shows_no_speed_up(make_pair):
    record, pilots = make_record("not_executed", make_pair)
    page = render(record, pilots)
    assert "1.2345" not in page and "1.1111" not in page and "paired ratio" not in page
    assert "the candidate did not execute" in page


def test_result_page_has_a_title_and_a_visible_video(tmp_path):
    session = Session.open("tiny-wan", device="cpu")
    result = session.generate(Request("a red circle moves left", seed=1, steps=1, frames=5, height=32, width=32))
    page = result.save(tmp_path).with_suffix(".html").read_text()
    assert "<title>a red circle moves left · tiny-wan</title>" in page
    assert "width:256px;height:256px;image-rendering:pixelated" in page and "<script" not in page


@pytest.mark.parametrize("verdict", ["no_speed_claim", "rejected_quality"])
def test_a_verdict_without_a_speed_claim_says_so_beside_its_speed_up(make_pair, verdict):
    """`rejected_quality` never carries a speed claim (`stats.verdict`), like `no_speed_claim`: its timed speed-up
    must not read as one in the qualification report or the review."""
    record, pilots = make_record(verdict, make_pair)
    claim = "1.2345 [1.1111, 1.3333] (baseline / candidate time)"
    for page in (render(record, pilots), review_page({"A": record})):
        assert f"{claim}; not a speed claim (see the verdict)" in html_text(page)
    qualified, _ = make_record("qualified", make_pair)
    assert f"{claim} " in html_text(render(qualified, None)) and "not a speed claim" not in render(qualified, None)


def test_reports_state_the_budget_in_words_and_the_review_names_each_failure(make_pair):
    """The budget reads as limits with their direction and unit (no JSON, no null for a dropped limit); the
    qualification report shows each audio limit's measured value, and the review says why a case is out of budget."""
    record, pilots = make_record("rejected_quality", make_pair)
    record["budget"] = Budget(psnr_db=None).with_audio().to_dict()
    words = Budget(psnr_db=None).with_audio().describe()
    page = review_page({"A": record})
    report, review = html_text(render(record, pilots)), html_text(page)
    for text in (report, review):
        assert words in text and "null" not in text and '"latent_rel_l2": 0.03' not in text
    assert all(row in report for row in ("audio SNR dB", "log-spectral distance dB", "RMS ratio error"))
    failures = record["cases"][0]["quality"]["failures"]
    assert failures and "; ".join(failures) in review
    head = '<th style="text-align:left">'
    assert f"{head}latent rel-L2</th>" in page and f"{head}budget failures</th>" in page  # the reports' wording
    # the receipts read as what each acceleration did, not as a JSON dump, in both reports
    record["cases"][0]["receipts"] = {
        "easycache": {"contract": "approximate", "options": {"threshold": 0.2}, "executed": True, "reused": 1},
        "fallback": {"contract": "bitwise", "options": {}, "executed": False, "fallbacks": {}},
    }
    said = (
        'easycache (approximate, options {"threshold": 0.2}): executed, reused 1 | fallback (bitwise): did not execute'
    )
    for text in (html_text(render(record, pilots)), html_text(review_page({"A": record}))):
        assert said in text and '"executed": true' not in text


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"kind": "stack", "status": "calibrated"}, r"records\['B'\]: a 'stack' record; allowed: a qualification"),
        ({"frames_shape": [5, 32, 32, 3], "timings": {}}, r"records\['B'\]: a record without 'verdict', 'cases'"),
        ([1, 2], r"records\['B'\]: a list; allowed: a qualification record"),
    ],
)
def test_review_refuses_a_record_that_is_not_a_qualification(make_pair, record, message):
    """The review notebook takes record paths: a calibrate `stack.json`, a `result.json` or a sweep record given by
    mistake is a ValueError naming the label, not a KeyError from deep inside the page."""
    qualification, _ = make_record("qualified", make_pair)
    with pytest.raises(ValueError, match=message):
        review_page({"A": qualification, "B": record})


@pytest.mark.parametrize(
    ("cases", "message"),
    [
        ([], r"records\['B'\]: 'cases' is \[\]; allowed: a non-empty list of case objects"),
        ("x", r"records\['B'\]: 'cases' is 'x'; allowed: a non-empty list"),
        ([{}], r"records\['B'\]: cases\[0\] is \{\}; allowed: an object with \['verdict', .*\(missing: verdict"),
        (lambda case: [case, {**case, "quality": None}], r"cases\[1\] is .*'speedup' and 'quality' objects"),
        (lambda case: [{**case, "speedup": {"median": 1.2}}], r"cases\[0\] .*\(missing: speedup.low, speedup.high\)"),
    ],
)
def test_review_refuses_a_qualification_whose_cases_are_cut_naming_the_case(make_pair, cases, message):
    """A qualification record whose cases were cut or hand-edited (no cases, a case without its quality or speed-up)
    is a ValueError naming the label and the case, not a KeyError or TypeError from inside the page (no cases: a
    page of empty tables, said nowhere)."""
    qualification, _ = make_record("qualified", make_pair)
    cut = {**qualification, "cases": cases(qualification["cases"][0]) if callable(cases) else cases}
    with pytest.raises(ValueError, match=message):
        review_page({"A": qualification, "B": cut})


def test_identical_frames_are_said_in_words_not_under_a_curves_caption(make_pair):
    a, _ = make_pair()
    record, _ = make_record("no_speed_claim", lambda: (a, a))
    page = render(record, [(a, a)])
    assert "Every frame equals the baseline's (5 of 5): PSNR inf, SSIM 1." in page
    assert "per-frame PSNR and SSIM" not in page and len(pngs(page)) == 1  # the round times only


@pytest.mark.parametrize("rounds", [3, 7, 30, 100])
def test_round_times_hides_no_point_and_names_runs_apart(rng, rounds):
    """Steady runs (every point near the slowest, the last baseline run the fastest, as in a CPU qualification of
    demo-av-mini): no point sits under the legend or on the axes' frame, and the run names under the x axis do not
    overlap at any allowed number of rounds."""
    a, b = 0.66 + rng.normal(0, 0.003, rounds + 1), 0.65 + rng.normal(0, 0.003, rounds)
    a[-1] = 0.6537
    figure = round_times(a, b)
    figure.draw_without_rendering()
    axes = figure.axes[0]
    legends = [legend.get_window_extent() for legend in [*figure.legends, axes.get_legend()] if legend]
    points = axes.transData.transform([(2 * i, y) for i, y in enumerate(a)] + [(2 * i + 1, y) for i, y in enumerate(b)])
    markers = [Bbox.from_extents(x - 5, y - 5, x + 5, y + 5) for x, y in points]  # a 6 pt marker is 8 px wide
    assert legends and not any(box.overlaps(marker) for box in legends for marker in markers)
    assert axes.get_ylim()[1] > 1.05 * max(a.max(), b.max())  # room above the slowest run
    names = [t.get_window_extent() for t in axes.get_xticklabels() if t.get_visible() and t.get_text()]
    assert len(names) >= min(2 * rounds + 1, 8) and not any(n.count_overlaps(names[:i]) for i, n in enumerate(names))
