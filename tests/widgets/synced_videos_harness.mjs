// Drives SyncedVideos' ESM in Node with a minimal fake DOM and model: the sync rules, without a browser.
// Usage: node synced_videos_harness.mjs /path/to/esm.mjs [steps.json]   (exits 1 at the first broken rule)
// The fake <video> reads currentTime back truncated to microseconds, as Chromium does. With steps.json
// ({"times": [...]}: the time Python sets for each frame of the slider, in order) it also steps through
// them and prints one line "steps <json>": per step the model's time, both videos' currentTime, and the
// times the view published back to Python meanwhile (Python maps those to the slider's frame).
import { pathToFileURL } from "node:url";

class El {
  constructor(tag) { this.tag = tag; this.style = {}; this.children = []; this.listeners = {}; }
  append(...c) { this.children.push(...c); }
  addEventListener(n, f) { (this.listeners[n] ||= []).push(f); }
  fire(n) { (this.listeners[n] || []).forEach((f) => f()); }
}
class Video extends El {
  constructor() { super("video"); this._t = 0; this.paused = true; this.ended = false; this.seeks = 0; }
  get currentTime() { return this._t; }
  set currentTime(t) { this._t = Math.trunc(t * 1e6) / 1e6; this.seeks++; this.fire("seeked"); }
  play() { if (this.paused) { this.paused = false; this.fire("play"); } return Promise.resolve(); }
  pause() { if (!this.paused) { this.paused = true; this.fire("pause"); } }
}
globalThis.document = { createElement: (t) => (t === "video" ? new Video() : new El(t)) };
class Model {
  constructor(s) { this.s = s; this.h = {}; this.saved = []; }
  get(k) { return this.s[k]; }
  set(k, v) { const old = this.s[k]; this.s[k] = v; if (old !== v) (this.h["change:" + k] || []).forEach((f) => f()); }
  save_changes() { this.saved.push({ ...this.s }); }
  published(k, since) { return this.saved.slice(since).map((state) => state[k]); }
  on(names, f) { names.split(" ").forEach((n) => (this.h[n] ||= []).push(f)); }
  off(names, f) { names.split(" ").forEach((n) => (this.h[n] = (this.h[n] || []).filter((g) => g !== f))); }
}
const { default: widget } = await import(pathToFileURL(process.argv[2]).href);
const state = { src_a: "data:a", src_b: "data:b", label_a: "dense", label_b: "cached", time: 0, playing: false };
const model = new Model({ ...state, fps: 24, frame_count: 49, loop: true, display_width: 256, display_height: 192 });
const el = new El("div");
const cleanup = widget.render({ model, el });
const [a, b] = el.children[0].children.map((fig) => fig.children[0]);
const ok = (c, m) => { if (!c) { console.error("FAIL", m); process.exit(1); } console.log("ok", m); };
ok(a.src === "data:a" && b.src === "data:b" && b.muted && !a.muted, "sources loaded, B muted");
ok(a.loop && b.loop && a.controls && a.style.width === "256px" && b.style.height === "192px", "loop, controls, size");
// Python sets time -> both seek
model.set("time", 5 / 24);
ok(Math.abs(a.currentTime - 5 / 24) < 1e-6 && a.currentTime === b.currentTime, "setting time seeks both");
ok(model.get("time") === 5 / 24, "a seek the view made does not write the browser's rounded time back");
const savedBefore = model.saved.length;
// user scrubs A -> time published, B follows
a.currentTime = 0.3;
ok(model.get("time") === 0.3 && b.currentTime === 0.3 && model.saved.length > savedBefore, "scrubbing A updates time and B");
// user plays B -> both play, playing published
b.play();
ok(!a.paused && !b.paused && model.get("playing") === true, "playing one plays both");
// playback: leader timeupdate publishes time; B keeps pace by its rate (a seek stalls it), seeked only a second away
a._t = 0.5; b._t = 0.45; const seeksB = b.seeks;
a.fire("timeupdate");
ok(model.get("time") === 0.5 && b.seeks === seeksB && Math.abs(b.playbackRate - 1.1) < 1e-9,
  "timeupdate publishes time; B 0.05 s behind plays 10% faster, not seeked");
a._t = 0.4; a.fire("timeupdate");
ok(b.seeks === seeksB && Math.abs(b.playbackRate - 0.9) < 1e-9, "B 0.05 s ahead plays 10% slower");
a._t = 0.3; b._t = 1.9; a.fire("timeupdate");  // A's loop wrapped first
ok(b.currentTime === 0.3 && b.seeks === seeksB + 1 && b.playbackRate === 1, "B a second or more away is seeked");
// stopped on the middle of the frame on screen at t (frame floor(t * 24), clamped to 0..48): the videos read it
// truncated to microseconds, as Chromium does, and Python holds it exactly
const middle = (t) => (Math.min(48, Math.floor(t * 24)) + 0.5) / 24;
const stopped = (t) => a.paused && b.paused && b.playbackRate === 1 && model.get("playing") === false
  && model.get("time") === middle(t) && a.currentTime === Math.trunc(middle(t) * 1e6) / 1e6
  && b.currentTime === a.currentTime;
// Python pauses: both stop on the middle of A's frame, and Python is told that time
a._t = 1.27; b._t = 1.31;  // frames 30 and 31
model.set("playing", false);
ok(stopped(1.27), "playing=false pauses both on the middle of A's frame and publishes it");
// user pauses via either video when playing
for (const [paused, t] of [[a, 0.7], [b, 1.02]]) {
  model.set("playing", true); ok(!a.paused && !b.paused, "playing=true plays both");
  a._t = t; b._t = t + 0.04;
  paused.pause();
  ok(stopped(t), "pausing one pauses both on the middle of A's frame and publishes it");
}
// the end (no loop): both on the last frame, Python told so
model.set("playing", true);
a._t = 49 / 24; b._t = 2.03; a.paused = b.paused = true; a.ended = true;
a.fire("pause"); a.fire("ended"); a.ended = false;
ok(stopped(49 / 24) && model.get("time") === 48.5 / 24, "the end stops both on the last frame and publishes it");
if (process.argv[3]) {
  const { times } = JSON.parse((await import("node:fs")).readFileSync(process.argv[3], "utf8"));
  const steps = times.map((t) => {
    const since = model.saved.length;
    model.set("time", t);  // what the slider's observer does in Python
    return { time: model.get("time"), a: a.currentTime, b: b.currentTime, published: model.published("time", since) };
  });
  console.log("steps " + JSON.stringify(steps));
}
cleanup();
model.set("time", 0.1);
ok(a.currentTime !== 0.1, "cleanup removed listeners");
