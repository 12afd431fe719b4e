"""What a person sees of the A/B players: a real JupyterLab driven by headless Debian Chromium.

A small notebook generates two demo-av clips (2 s at 24 fps, 128x128: stock and easycache) and shows an
`ABPlayer` and an `ABAudio` of them. The checks: every frame 0..T-1 is reached by ArrowRight, End and
the mouse with both videos on that frame after each step (Chromium truncates `currentTime` to
microseconds, which once made the slider skip frames at 24 fps), a pause or the end leaves both videos,
the slider and the caption on one frame, the videos render at least 256 px, the row of videos, heatmap
and curves fits a 1400 px screen beside Lab's file browser, and the audio shows its true duration.
`python -m pytest tests/browser -k screenshot` rewrites docs/ab_view.png (1400x1100).

Needs /usr/bin/chromium (`apt-get install chromium`) and the `playwright` Python package; without
either it is skipped with the reason (never a fake pass), or fails with it under WORKBENCH_REQUIRE_BROWSER=1
(conftest.py). `playwright install` cannot download a browser here, so the system Chromium is launched by path.
"""

import json
import math
import urllib.request
from pathlib import Path

import nbformat
import pytest

CHROMIUM = Path("/usr/bin/chromium")
ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT = ROOT / "docs" / "ab_view.png"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
FPS, FRAMES = 24, 49  # demo-av's defaults: 49 frames at 24 fps, where 1/24 s is not a whole microsecond
AB_NOTEBOOK = [
    "from workbench import Request, Session\nfrom workbench.widgets import ABAudio, ABPlayer\n"
    "session = Session.open('demo-av', device='cpu')\n"
    "request = Request('a red circle moves left slow on a dark background, soft low hum', seed=0, steps=6)\n"
    "stock = session.generate(request, progress=False)\n"
    "session.accelerate({'easycache': {'threshold': 0.2}})\n"
    "cached = session.generate(request, progress=False)\n"
    f"assert (stock.fps, stock.frames.shape[0]) == ({FPS}, {FRAMES}), (stock.fps, stock.frames.shape)",
    "ABPlayer(stock, cached, labels=('stock', 'easycache'))",
    "ABAudio(stock, cached, labels=('stock', 'easycache'))",
]

if not CHROMIUM.exists():
    pytest.skip(f"{CHROMIUM} is missing: apt-get install chromium", allow_module_level=True)
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="the playwright package is missing: pip install playwright"
)


def put(base: str, token: str, path: str, body: dict) -> None:
    """PUT `body` to the Jupyter server's REST API (a notebook through /api/contents, a setting through the lab)."""
    request = urllib.request.Request(
        f"{base}/{path}?token={token}",
        data=json.dumps(body).encode(),
        method="PUT",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status in (200, 201, 204), (path, response.status)


def run_all(page, base: str, token: str, name: str) -> None:
    """Open notebook `name` in JupyterLab, pick the kernel if asked, and run every cell."""
    page.goto(f"{base}/lab/tree/{name}?reset&token={token}")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    select = page.locator(".jp-Dialog button", has_text="Select")  # "Select Kernel", when Lab asks
    try:
        select.wait_for(timeout=3_000)
        select.click()
    except sync_api.TimeoutError:
        pass
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=60_000)
    page.locator(".jp-Notebook .jp-Cell").first.click()
    page.locator(".lm-MenuBar-item", has_text="Run").first.click()
    page.locator(".lm-Menu-item[data-command='runmenu:run-all']").click()


@pytest.fixture(scope="module")
def ab_page(lab):
    """The A/B notebook run in Lab at 1400x1100 as Lab opens (file browser shown): (page, player locator)."""
    base, token, tmp_path = lab
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in AB_NOTEBOOK])
    put(base, token, "api/contents/ab.ipynb", {"type": "notebook", "content": json.loads(nbformat.writes(notebook))})
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            run_all(page, base, token, "ab.ipynb")
            player = page.locator(".vflash-ab-player").first
            try:
                player.wait_for(timeout=120_000)
                page.wait_for_function(
                    "() => [...document.querySelectorAll('.vflash-ab-player video')].every((v) => v.readyState >= 2)",
                    timeout=30_000,
                )
            except sync_api.TimeoutError:
                page.screenshot(path=str(tmp_path / "failed.png"), full_page=True)
                raise
            yield page, player
        finally:
            browser.close()


def frame_state(page) -> dict:
    return page.evaluate(
        """() => {
            const player = document.querySelector('.vflash-ab-player');
            const times = [...player.querySelectorAll('video')].map((v) => v.currentTime);
            const readout = player.querySelector('.widget-slider .widget-readout');
            return { times, frame: Number(readout.textContent.trim()) };
        }"""
    )


def wait_for_frame(page, frame: int) -> dict:
    """Wait until the slider reads `frame` and both videos show it at the same time; the state."""
    try:
        _wait_for_frame(page, frame)
    except sync_api.TimeoutError:
        raise AssertionError(f"frame {frame} not reached: {frame_state(page)}") from None
    return frame_state(page)


def _wait_for_frame(page, frame: int) -> None:
    page.wait_for_function(
        """([frame, fps]) => {
            const player = document.querySelector('.vflash-ab-player');
            const times = [...player.querySelectorAll('video')].map((v) => v.currentTime);
            const readout = Number(player.querySelector('.widget-slider .widget-readout').textContent.trim());
            return readout === frame && times.length === 2 && times[0] === times[1]
                && Math.floor(times[0] * fps) === frame && !player.querySelector('video').seeking;
        }""",
        arg=[frame, FPS],
        timeout=10_000,
    )


def test_every_frame_is_reachable_with_both_videos_together(ab_page):
    page, player = ab_page
    handle = player.locator(".widget-slider .noUi-handle").first
    handle.focus()
    reached = [wait_for_frame(page, 0)["frame"]]
    for _ in range(FRAMES - 1):
        handle.press("ArrowRight")
        state = wait_for_frame(page, reached[-1] + 1)
        reached.append(state["frame"])
    assert reached == list(range(FRAMES))  # ArrowRight steps 0, 1, 2, ..., T-1
    handle.press("Home")
    wait_for_frame(page, 0)
    handle.press("End")
    end = wait_for_frame(page, FRAMES - 1)
    assert math.floor(end["times"][0] * FPS) == FRAMES - 1
    track = player.locator(".widget-slider .noUi-base").first.bounding_box()
    middle = track["y"] + track["height"] / 2
    # noUiSlider ignores a tap while the previous one's 300 ms animation (.noUi-state-tap) runs, and the
    # handle is only where it belongs once that animation is over
    settled = "() => !document.querySelector('.vflash-ab-player .noUi-state-tap')"
    for frame in (5, 2):  # the mouse: a click where the frame sits on the track
        page.wait_for_function(settled)
        page.mouse.click(track["x"] + track["width"] * frame / (FRAMES - 1), middle)
        wait_for_frame(page, frame)
    page.wait_for_function(settled)
    box = handle.bounding_box()  # and a drag of the handle past the end of the track
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.down()
    page.mouse.move(track["x"] + track["width"] + 50, middle, steps=8)
    page.mouse.up()
    wait_for_frame(page, FRAMES - 1)
    handle.press("Home")
    wait_for_frame(page, 0)
    player.locator("button[title='next frame']").click()
    wait_for_frame(page, 1)
    player.locator("button[title='previous frame']").click()
    wait_for_frame(page, 0)
    print(f"frames reached by keyboard: {reached}; End -> {end}")


def wait_until_stopped(page) -> dict:
    """Wait until both videos are paused on one time, the middle of a frame, and the slider and the caption (what the
    heatmap and the curves are drawn for) say that frame; the state."""
    try:
        page.wait_for_function(
            """(fps) => {
                const player = document.querySelector('.vflash-ab-player');
                const videos = [...player.querySelectorAll('video')];
                const [a, b] = videos.map((v) => v.currentTime);
                const frame = Math.floor(a * fps);
                const readout = Number(player.querySelector('.widget-slider .widget-readout').textContent.trim());
                const caption = [...player.querySelectorAll('.widget-html')].map((h) => h.innerText.trim())
                    .find((text) => /^frame \\d+ \\(/.test(text));
                return videos.every((v) => v.paused && !v.seeking) && a === b && Math.abs(a * fps - frame - 0.5) < 1e-3
                    && readout === frame && (caption || '').startsWith(`frame ${frame} (`);
            }""",
            arg=FPS,
            timeout=10_000,
        )
    except sync_api.TimeoutError:
        raise AssertionError(f"not stopped on one frame: {frame_state(page)}") from None
    return frame_state(page)


def test_pause_and_the_end_leave_both_videos_the_slider_and_the_caption_on_one_frame(ab_page):
    """Paused by "pause both", by a video's own control, or at the end (loop off), both videos stop on the middle of
    the frame A shows, and the slider, the heatmap and the caption show that frame; "pause both" once left A, B and
    the slider on three frames (the slider followed A's timeupdate, ~4 times a second; B drifted up to 0.15 s)."""
    page, player = ab_page
    playing = "() => [...document.querySelectorAll('.vflash-ab-player video')].every((v) => !v.paused)"
    stops = []
    for pause in ("the button", "B's own control"):
        player.locator("button", has_text="play both").click()
        page.wait_for_function(playing, timeout=10_000)
        page.wait_for_timeout(1100)
        if pause == "the button":
            player.locator("button", has_text="pause both").click()
        else:
            page.evaluate("() => document.querySelectorAll('.vflash-ab-player video')[1].pause()")
        stops.append(wait_until_stopped(page))
    loop = "(on) => document.querySelectorAll('.vflash-ab-player video').forEach((v) => { v.loop = on; })"
    page.evaluate(loop, False)
    try:
        handle = player.locator(".widget-slider .noUi-handle").first
        handle.focus()
        handle.press("End")
        wait_for_frame(page, FRAMES - 1)
        for frame in range(FRAMES - 2, FRAMES - 14, -1):  # to half a second before the end, a key at a time
            handle.press("ArrowLeft")  # (a key pressed while the last seek's time comes back may be lost)
            wait_for_frame(page, frame)
        player.locator("button", has_text="play both").click()
        page.wait_for_function(playing, timeout=10_000)
        end = wait_until_stopped(page)
    finally:
        page.evaluate(loop, True)
    assert end["frame"] == FRAMES - 1, end
    print(f"paused by the button, by B's control: {stops}; at the end: {end}")


def test_videos_heatmap_and_curves_fit_one_row_at_1400_px(ab_page):
    page, player = ab_page
    boxes = page.evaluate(
        """() => {
            const player = document.querySelector('.vflash-ab-player');
            const box = (el) => { const r = el.getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; };
            const images = [...player.querySelectorAll('img')];
            return {
                videos: [...player.querySelectorAll('video')].map(box),
                images: images.map(box),
                controls: [...player.querySelectorAll('video')].map((v) => v.controls && v.loop),
                pixelated: getComputedStyle(player.querySelector('video')).imageRendering,
                overflow: document.documentElement.scrollWidth - window.innerWidth,
                row: box(player.querySelector('video').closest('.widget-hbox')),
            };
        }"""
    )
    print(f"A/B row: {boxes}")
    videos, images = boxes["videos"], boxes["images"]
    assert len(videos) == 2 and len(images) == 2  # heatmap and PSNR/SSIM curves
    assert all(width >= 256 and height >= 256 for _, _, width, height in videos)
    assert boxes["controls"] == [True, True] and boxes["pixelated"] == "pixelated"
    tops = [top for _, top, _, _ in videos + images]
    assert max(tops) - min(tops) < 40, f"not one row: tops {tops}"
    assert max(left + width for left, _, width, _ in videos + images) <= 1400 and boxes["overflow"] <= 0
    assert "128x128 px, shown x2" in player.inner_text()


def test_audio_players_show_the_true_duration(ab_page):
    page, _ = ab_page
    readouts = page.locator(".vflash-ab-audio .vflash-audio-time")
    readouts.first.wait_for(timeout=10_000)
    texts = readouts.all_inner_texts()
    durations = [float(text.split(" / ")[1].removesuffix(" s")) for text in texts]
    assert len(texts) == 2 and all(abs(d - FRAMES / FPS) < 0.05 for d in durations), texts  # Chromium: "0:00"


def test_ab_view_screenshot(ab_page):
    """Writes docs/ab_view.png: the A/B player at the top of a 1400x1100 screen, on its most different frame."""
    page, player = ab_page
    page.evaluate("() => document.querySelector('.vflash-ab-player').closest('.jp-Cell').scrollIntoView()")
    handle = player.locator(".widget-slider .noUi-handle").first
    handle.focus()
    handle.press("End")
    handle.press("ArrowLeft")
    wait_for_frame(page, FRAMES - 2)
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=30_000)
    page.wait_for_timeout(500)  # the curves' PNG (drawn last) reaches the page
    page.evaluate("() => document.activeElement.blur()")
    SCREENSHOT.parent.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOT))
    assert SCREENSHOT.stat().st_size > 10_000
