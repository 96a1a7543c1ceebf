// The page's video mode: a session's frames under a slider, clicks and boxes on any frame
// (POST /v1/videos/{id}/prompts), propagation forwards or backwards with each frame's
// masks drawn as it streams in (the view follows the propagation), Stop (closing the
// stream stops the server's propagation at its next frame), corrections on any frame
// and propagation again, a phrase found and tracked through the clip by SAM 3
// (video_concepts.js: each instance an object named by its phrase), clicks on its objects
// refining them with SAM 3 (video_refine.js: the search run again with the clicks), and
// the export as COCO or YouTube-VIS. A propagation and a search (a refinement is one too)
// are both a streamed run (stream_run.js): one at a time, with the same progress and Stop.
// app.js hands it the stage, the pointer's prompts and the keys while a video is open.
//
// An object (video_objects.js) has its masks in the session, per frame. A name goes with
// the object's first prompt, later ones as a rename (video_names.js), in the order of the
// prompts; a found object has its phrase as its name on the server already.
//
// Corrections follow SAM 2.1's video predictor (Meta's, which the server reproduces): a
// prompt on a frame a propagation has already tracked for the object is a correction, and
// a later propagation that runs through that frame tracks it again from memory, which
// replaces the correction's mask. So a propagation from a corrected frame starts at the
// next frame (the correction is then the memory the next frames follow), and one that
// runs through a corrected frame says that it replaced it.

import { button, element } from "./dom.js";
import { download } from "./files.js";
import { StreamRun, summary } from "./stream_run.js";
import { record } from "./timings.js";
import { VideoSession } from "./video.js";
import { FindInVideo, checkPhrases, checkThreshold, quoted } from "./video_concepts.js";
import { adopt, foundBefore, objectOf } from "./video_objects.js";
import { addClick, clicked, refinement } from "./video_refine.js";
import { MAX_NAME_CHARS, checkName, displayName, drawNames, namesOf, renameObject } from "./video_names.js";

const $ = (selector) => document.querySelector(selector);
const PLAY_FPS = 10; // frames per second when the video has no rate (uploaded frames)
const BIG_STEP = 10; // Shift + arrow

export class Player {
  /** `page`: {api, stage, say, fail, busyNotice, setState} from app.js. */
  constructor(page) {
    Object.assign(this, page);
    this.session = null;
    this.opening = 0; // token of the latest open(): an older one's answer is dropped
    this.objects = [];
    this.activeId = null;
    this.nextId = 1;
    this.current = 0;
    this.shown = 0; // token of the latest frame asked for
    this.run = null; // the StreamRun in flight: a propagation or a search
    this.playing = null; // interval of play
    this.queue = Promise.resolve(); // prompts go one at a time: the session takes one
    this.finder = new FindInVideo(
      (text, thresh) => this.findInVideo(text, thresh),
      () => this.refine(),
    );
    this.searches = new Map(); // phrase -> {start, thresh} of its last search (refinements)
    this.wire();
  }

  get active() {
    return document.body.dataset.mode === "video";
  }

  // ------------------------------------------------------------------------- session

  /** Open a video (`source`: {video: Blob} or {frames: [File]}) as a new session. */
  async open(source, name) {
    this.close();
    const token = ++this.opening;
    document.body.dataset.mode = "video";
    document.body.dataset.video = "loading";
    $("#video-bar").hidden = false;
    const what = source.video ? name : `${source.frames.length} frames`;
    this.setState(`Uploading ${what}…`, "loading");
    this.say("");
    this.render();
    try {
      const session = await VideoSession.create(this.api, source, name, {
        onWait: this.busyNotice("uploading the video"),
      });
      if (token !== this.opening) return session.close();
      this.session = session;
      $("#video-slider").max = String(session.numFrames - 1);
      await this.show(0);
      document.body.dataset.video = "ready";
      this.setState(
        `${name}: ${session.numFrames} frames, ${session.width}×${session.height}`,
        "ready",
      );
      this.say("Click an object on any frame (drag: a box), then propagate: f forwards, b backwards.");
    } catch (error) {
      if (token !== this.opening) return;
      document.body.dataset.video = "error";
      this.setState(`${name}: not opened`, "error");
      this.fail(error, `Opening ${name}`, () => this.open(source, name));
    } finally {
      this.render();
    }
  }

  /** Leave video mode: a run stops, the session is closed on the server. */
  close() {
    this.stop();
    this.pause();
    this.opening++;
    this.session?.close();
    this.session = null;
    this.objects = [];
    this.activeId = null;
    this.nextId = 1;
    this.current = 0;
    this.searches.clear();
    $("#video-bar").hidden = true;
    document.body.dataset.mode = "image";
    document.body.dataset.video = "none";
  }

  // ------------------------------------------------------------------------- frames

  /** Show frame `index`: its masks at once, its picture when it has come. */
  async show(index) {
    const session = this.session;
    if (!session) return;
    this.current = Math.max(0, Math.min(session.numFrames - 1, index));
    const token = ++this.shown;
    this.render();
    try {
      const bitmap = await session.frame(this.current);
      if (token !== this.shown || session !== this.session) return;
      this.stage.showFrame(bitmap);
      $("#drop-hint").hidden = true;
      this.renderStage();
      document.body.dataset.frame = String(this.current); // what the picture shows
    } catch (error) {
      if (token === this.shown) this.fail(error, `Showing frame ${this.current}`);
    }
  }

  step(by) {
    if (this.session) this.show(this.current + by);
  }

  togglePlay() {
    if (this.playing) return this.pause();
    if (!this.session) return;
    if (this.current >= this.session.numFrames - 1) this.show(0);
    const fps = Math.min(30, this.session.fps || PLAY_FPS);
    this.playing = setInterval(() => {
      if (this.current >= this.session.numFrames - 1) return this.pause();
      this.show(this.current + 1);
    }, 1000 / fps);
    this.render();
  }

  pause() {
    if (!this.playing) return;
    clearInterval(this.playing);
    this.playing = null;
    this.render();
  }

  // ------------------------------------------------------------------------- objects

  activeObject() {
    return this.objects.find((object) => object.id === this.activeId) ?? null;
  }

  newObject() {
    const active = this.activeObject();
    if (active && active.prompts.size === 0 && !active.onServer) {
      return this.say(`${displayName(active)} has no prompt yet: click on the frame to make its mask.`);
    }
    const object = objectOf(this.nextId++);
    this.objects.push(object);
    this.activeId = object.id;
    this.render();
    return object;
  }

  activate(id) {
    if (this.objects.some((object) => object.id === id)) this.activeId = id;
    this.render();
  }

  async remove(id) {
    if (!this.session) return;
    if (this.run) return this.say(`Stop ${this.run.the()} first (Esc).`);
    try {
      await this.session.removeObject(id);
      this.objects = this.objects.filter((object) => object.id !== id);
      if (this.activeId === id) this.activeId = this.objects.at(-1)?.id ?? null;
    } catch (error) {
      this.fail(error, "Removing the object");
    }
    this.render();
  }

  /** Name the object from its field's text (empty: unnamed): checked here by the server's
   * rule, then sent after the prompts already queued. */
  rename(object, text) {
    const { name, error } = checkName(text);
    if (error) {
      this.say(`Not renamed: ${error}.`, "error");
      return this.renderObjects(true);
    }
    object.name = name;
    this.renderStage();
    this.queue = this.queue.then(() => this.sendName(object));
  }

  async sendName(object) {
    const session = this.session;
    // Before its first prompt the session does not know the object: the prompt names it.
    if (!session || !object.onServer || object.name === object.serverName) return;
    if (!this.objects.includes(object)) return;
    try {
      const described = await renameObject(session, object.id, object.name);
      if (session !== this.session) return;
      object.serverName = namesOf(described).get(object.id) ?? null;
    } catch (error) {
      this.fail(error, `Naming ${displayName(object)}`);
    }
  }

  /** Put the cursor in the active object's name field. */
  focusName() {
    const field = $(`#object-list li[data-id="${this.activeId}"] input.name`);
    field?.focus();
    field?.select();
  }

  toggleVisible(id) {
    const object = this.objects.find((o) => o.id === id);
    if (object) object.visible = !object.visible;
    this.render();
  }

  /** A click ({point}) or a box ({box}) for the active object on the frame shown. On an
   * object SAM 3 found, a click waits for a refinement with SAM 3 (g); a box, or a click
   * with `sam2` (Alt+click), hands it to SAM 2.1. */
  addPrompt(prompt) {
    if (!this.session) return this.say("Wait until the video is open.");
    if (this.run) return this.say(`Stop ${this.run.the()} first (Esc), or wait for its end.`);
    this.pause();
    const object = this.activeObject() ?? this.newObject();
    const frame = this.current;
    if (object.tracker === "sam3" && prompt.point && !prompt.sam2) {
      const start = this.searches.get(object.phrase)?.start ?? 0;
      const refused = addClick(this.objects, object, frame, prompt.point, start);
      if (refused) return this.say(`Click not kept: ${refused}.`, "error");
      this.render();
      return this.say(
        `${displayName(object)}: clicks for SAM 3 on frame ${frame}; g (Refine with SAM 3) ` +
          `finds ${quoted([object.phrase])} again with them (Alt+click: hand it to SAM 2.1).`,
      );
    }
    // A found object's first click makes it SAM 2.1's there (handOver): no correction.
    if (object.tracker !== "sam3" && this.session.tracked[frame].has(object.id)) {
      object.corrections.add(frame);
    }
    const before = object.prompts.get(frame) ?? { points: [], box: null };
    object.prompts.set(
      frame,
      prompt.box ? { ...before, box: prompt.box } : { ...before, points: [...before.points, prompt.point] },
    );
    this.render();
    const clickedAt = performance.now();
    this.queue = this.queue.then(() => this.sendPrompt(object, frame, clickedAt));
  }

  async sendPrompt(object, frame, clickedAt) {
    const session = this.session;
    const prompts = object.prompts.get(frame);
    if (!session || !prompts || !this.objects.includes(object)) return;
    try {
      if (object.tracker === "sam3") await this.handOver(object, frame);
      const name = object.name !== object.serverName ? object.name : null;
      const answer = await session.prompt(frame, object.id, prompts, name);
      if (session !== this.session) return;
      object.onServer = true;
      const mine = answer.objects.find((o) => o.obj_id === object.id);
      if (mine) object.serverName = mine.name ?? null;
      record("video-click", performance.now() - clickedAt, {
        server_ms: answer.inference_ms,
        queue_ms: answer.queue_ms,
      });
      if (frame === this.current) this.renderStage();
      this.renderObjects();
      if ($("#message").dataset.level !== "error") this.say("");
    } catch (error) {
      this.fail(error, `Segmenting on frame ${frame}`);
    }
  }

  /** An object SAM 3 found becomes SAM 2.1's at its first click (video_objects.js): its
   * mask on the clicked frame is SAM 2.1's mask prompt, which the click then corrects. */
  async handOver(object, frame) {
    const session = this.session;
    const seeded = await session.handOver(frame, object.id, object.name);
    object.tracker = "sam2.1";
    object.refine = null; // its clicks for SAM 3 go
    object.onServer = seeded !== null;
    object.serverName = seeded?.objects.find((o) => o.obj_id === object.id)?.name ?? null;
  }

  // ------------------------------------------------------------------------- propagation

  /** Track every object from the frame shown to the end (or to frame 0: `reverse`). */
  async propagate(reverse) {
    const session = this.session;
    if (!session || this.run) return;
    if (!this.objects.some((object) => object.prompts.size)) {
      const found = this.objects.length
        ? " (SAM 3's objects are tracked already; Alt+click on one hands it to SAM 2.1)"
        : "";
      return this.say(`Click an object first: there is nothing for SAM 2.1 to track yet${found}.`);
    }
    this.pause();
    const origin = this.current;
    const corrected = this.objects.some((object) => object.corrections.has(origin));
    const start = corrected ? origin + (reverse ? -1 : 1) : origin;
    if (start < 0 || start >= session.numFrames) {
      return this.say(`Frame ${origin} is a correction and there is no frame past it.`);
    }
    const replaced = new Set(); // corrected frames this propagation tracks again
    const run = new StreamRun({
      doing: `Propagating ${reverse ? "backwards" : "forwards"}`,
      noun: "Propagation",
      state: "propagating",
      expected: reverse ? start + 1 : session.numFrames - start,
    });
    const request = () =>
      session.propagate({
        start,
        reverse,
        signal: run.signal,
        onFrame: (frameIdx, count) => {
          for (const object of this.objects) {
            if (object.corrections.delete(frameIdx)) replaced.add(frameIdx);
          }
          this.follow(run, frameIdx, count);
        },
      });
    const finished = (done) => {
      const from = corrected ? ` from frame ${start} (after the correction on ${origin})` : "";
      const lost = replaced.size
        ? ` It tracked the corrected frame${replaced.size > 1 ? "s" : ""} ` +
          `${[...replaced].join(", ")} again (SAM 2 keeps a correction only on a frame the ` +
          "propagation starts after)."
        : "";
      this.say(`Propagated ${reverse ? "backwards" : "forwards"}${from} over ${summary(done)}.${lost}`);
    };
    await this.streamed(run, request, finished, "Propagating");
  }

  /** Find every instance of the typed phrases (comma-separated) from the frame shown to the
   * last, tracked by SAM 3's video predictor on the server (one run per phrase); each
   * becomes an object named by its phrase. */
  async findInVideo(text, threshText = "") {
    const session = this.session;
    if (!session) return this.say("Open a video first.");
    if (this.run) return this.say(`Stop ${this.run.the()} first (Esc), or wait for its end.`);
    const { phrases, error } = checkPhrases(text);
    if (error) return this.say(`Not searched: ${error}.`, "error");
    const { thresh, error: refused } = checkThreshold(threshText);
    if (refused) return this.say(`Not searched: ${refused}.`, "error");
    this.pause();
    const start = this.current;
    const found = [];
    const named = quoted(phrases);
    const run = new StreamRun({
      doing: `Finding ${named}`,
      noun: `Search for ${named}`,
      state: "finding",
      expected: session.numFrames - start,
    });
    const request = () =>
      session.trackConcept({
        phrases,
        start,
        scoreThresh: thresh,
        signal: run.signal,
        onAccepted: () =>
          phrases.forEach((phrase) => {
            this.dropFound(phrase);
            this.searches.set(phrase, { start, thresh });
          }),
        onFrame: (frameIdx, count, objects) => {
          found.push(...adopt(this, objects, phrases[0]));
          run.detail = ` · ${found.length} found`;
          this.follow(run, frameIdx, count);
        },
      });
    const finished = (done) => {
      const what = found.length === 1 ? "1 instance" : `${found.length} instances`;
      const dropped = done.dropped_objects
        ? ` ${done.dropped_objects} more found later had no room (max_video_objects).`
        : "";
      const each = phrases.length === 1 ? `named "${phrases[0]}"` : "named by its phrase";
      this.say(
        `Found ${what} of ${named} from frame ${start} over ${summary(done)}` +
          (found.length
            ? `: each an object ${each}. Clicks on one, then g, refine it with SAM 3 ` +
              "(Alt+click or a box: SAM 2.1's video prompts, like any object)."
            : `: none scored over the threshold (${done.score_thresh}).`) +
          dropped,
      );
    };
    await this.streamed(run, request, finished, `Finding ${named} in the video`);
  }

  /** Refine the objects SAM 3 found with the clicks made on them (video_refine.js): their
   * phrase's search runs again on the server (its first frame and threshold) with the
   * clicks, streamed as a search; a frame answered again replaces its earlier masks. */
  async refine() {
    const session = this.session;
    if (!session) return this.say("Open a video first.");
    if (this.run) return this.say(`Stop ${this.run.the()} first (Esc), or wait for its end.`);
    const { phrase, start, thresh, clicks, error } = refinement(this.objects, this.searches);
    if (error) return this.say(`Not refined: ${error}.`, "error");
    this.pause();
    const named = quoted([phrase]);
    const active = this.activeId;
    const order = this.objects.map((object) => object.id); // the list keeps its order
    const place = (object) => (order.includes(object.id) ? order.indexOf(object.id) : order.length);
    const run = new StreamRun({
      doing: `Refining ${named}`,
      noun: `Refinement of ${named}`,
      state: "refining",
      // the pass, each click's frame, then the partial pass over the same frames
      expected: 2 * (session.numFrames - start) + clicks.length,
    });
    const request = () =>
      session.trackConcept({
        text: phrase,
        start,
        scoreThresh: thresh,
        clicks,
        signal: run.signal,
        onAccepted: () => this.dropFound(phrase),
        onFrame: (frameIdx, count, objects) => {
          if (adopt(this, objects, phrase).length) this.objects.sort((a, b) => place(a) - place(b));
          if (this.objects.some((object) => object.id === active)) this.activeId = active;
          this.follow(run, frameIdx, count);
        },
      });
    const finished = (done) => {
      this.keepReported(phrase, done.objects);
      const applied = done.clicks_applied === 1 ? "1 click" : `${done.clicks_applied} clicks`;
      const objects = new Set(clicks.map((click) => click.obj_id)).size;
      this.say(
        `Refined ${named} with SAM 3 (${applied} applied, on ${objects} object` +
          `${objects === 1 ? "" : "s"}) from frame ${start}: ${summary(done)}; frames answered ` +
          "again replaced their masks.",
      );
    };
    await this.streamed(run, request, finished, `Refining ${named} with SAM 3`);
  }

  /** After a refinement: the objects of `phrase` the server kept (`reported`, the final
   * answers' objects); one the first pass found and the final answers do not have is gone
   * from the session, so from the list too. */
  keepReported(phrase, reported) {
    const kept = new Set(reported.map((span) => span.obj_id));
    const gone = foundBefore(this.objects, phrase).filter((object) => !kept.has(object.id));
    for (const object of gone) this.session.forget(object.id);
    this.objects = this.objects.filter((object) => !gone.includes(object));
    if (gone.some((object) => object.id === this.activeId)) this.activeId = null;
  }

  /** The objects an earlier search for `phrase` found, still SAM 3's: the server replaced
   * them with the new search's. */
  dropFound(phrase) {
    const gone = foundBefore(this.objects, phrase);
    for (const object of gone) this.session.forget(object.id);
    this.objects = this.objects.filter((object) => !gone.includes(object));
    if (gone.some((object) => object.id === this.activeId)) this.activeId = null;
  }

  /** Run a streamed job: `request()` streams it (resolving to the server's summary, which
   * `finished` tells), shown by renderProgress() until it ends; Stop (Esc) aborts it, a
   * failure is said as `failed` failed. */
  async streamed(run, request, finished, failed) {
    const session = this.session;
    this.run = run;
    document.body.dataset.video = run.state;
    this.render();
    await this.queue; // the clicks already made go first
    try {
      finished(await request());
    } catch (error) {
      if (error?.name === "AbortError") this.say(run.stopped());
      else this.fail(error, failed);
    } finally {
      if (this.run === run) this.run = null;
      if (session === this.session) document.body.dataset.video = "ready";
      document.body.dataset.propagated = String(run.received);
      this.render();
    }
  }

  /** A frame of the run came (the `count`th): the view follows it, the progress counts it. */
  follow(run, frameIdx, count) {
    run.received = count;
    this.show(frameIdx);
    this.renderProgress();
  }

  /** Stop the run (a propagation or a search): its stream is closed, and the server stops
   * at its next frame. */
  stop() {
    this.run?.stop();
  }

  // ------------------------------------------------------------------------- export

  async export(format) {
    const session = this.session;
    if (!session) return;
    const objects = this.objects.filter((object) => session.framesWith(object.id) > 0);
    if (!objects.length) return this.say("Nothing to export yet: no object has a mask.");
    const stem = session.name.replace(/\.[^.]+$/, "") || "video";
    const file = `${stem}_${format === "coco" ? "coco" : "ytvis"}.json`;
    const what = format === "coco" ? "COCO" : "YouTube-VIS";
    try {
      const body = session.exportBody(format, objects);
      const dataset = await this.api.retrying(
        () => this.api.call("POST", "/v1/video-export", { json: body }),
        { onWait: this.busyNotice("exporting") },
      );
      download(new Blob([JSON.stringify(dataset)], { type: "application/json" }), file);
      this.say(`Exported ${objects.length} objects over ${body.frames.length} frames as ${what} (${file}).`);
    } catch (error) {
      this.fail(error, `Exporting ${what}`, () => this.export(format));
    }
  }

  // ------------------------------------------------------------------------- rendering

  render() {
    const session = this.session;
    const frames = session?.numFrames ?? 0;
    $("#video-slider").value = String(this.current);
    $("#video-slider").disabled = !session;
    $("#video-frame").textContent = session ? `frame ${this.current} / ${frames - 1}` : "";
    $("#video-play").textContent = this.playing ? "❚❚" : "▶";
    for (const id of ["#video-prev", "#video-next", "#video-play"]) $(id).disabled = !session;
    const idle = Boolean(session) && !this.run;
    $("#propagate").disabled = !idle;
    $("#propagate-back").disabled = !idle;
    $("#propagate-stop").hidden = !this.run;
    this.finder.render(idle, clicked(this.objects).length > 0);
    const exportable = idle && this.objects.some((object) => session.framesWith(object.id) > 0);
    $("#export-video-coco").disabled = !exportable;
    $("#export-ytvis").disabled = !exportable;
    this.renderProgress();
    this.renderStage();
    this.renderObjects();
  }

  renderProgress() {
    const run = this.run;
    const progress = $("#propagate-progress");
    progress.hidden = !run;
    if (!run) return;
    progress.max = run.expected;
    progress.value = run.received;
    this.say(run.progress(), "busy");
  }

  renderStage(drag = null) {
    const session = this.session;
    if (!session || !this.stage.width) return;
    const masks = session.masks[this.current];
    this.stage.renderMasks(
      this.objects.map((object) => ({
        mask: masks.get(object.id) ?? null,
        visible: object.visible,
        colour: object.colour,
      })),
    );
    this.renderPrompts(drag);
  }

  /** The visible objects' names beside their masks on the frame shown. */
  renderNames() {
    const boxes = this.session.boxes[this.current];
    const labels = this.objects
      .filter((object) => object.visible && boxes.get(object.id)?.[2] > 0)
      .map((object) => ({ name: displayName(object), colour: object.colour, bbox: boxes.get(object.id) }));
    drawNames(this.stage, labels);
  }

  /** The clicks and boxes on the frame shown (and a box being dragged). */
  renderPrompts(drag = null) {
    if (!this.session) return;
    const here = this.objects.map((object) => {
      const prompts = object.prompts.get(this.current);
      return {
        id: object.id,
        colour: object.colour,
        visible: object.visible,
        // an object SAM 3 found: its clicks waiting for a refinement (video_refine.js)
        points: [...(prompts?.points ?? []), ...(object.refine?.get(this.current) ?? [])],
        box: prompts?.box ?? null,
      };
    });
    this.stage.renderPrompts(here, this.activeId, drag);
    this.renderNames();
  }

  renderObjects(force = false) {
    const session = this.session;
    // A name being typed keeps its field (the list is drawn again at the next change).
    if (!force && $("#object-list").contains(document.activeElement)) return;
    $("#object-list").replaceChildren(
      ...this.objects.map((object, index) => {
        const item = document.createElement("li");
        item.dataset.id = object.id;
        item.classList.toggle("active", object.id === this.activeId);
        item.classList.toggle("hidden-object", !object.visible);
        const swatch = element("span", "swatch");
        swatch.style.background = object.colour;
        const name = element("input", "name");
        name.value = object.name ?? "";
        name.placeholder = displayName({ id: object.id, name: null });
        name.maxLength = MAX_NAME_CHARS;
        name.title =
          `Object ${index + 1} (obj_id ${object.id}): its name (class or label) is its ` +
          "category in the export; the session keeps it (r: name the selected object)";
        name.addEventListener("change", () => this.rename(object, name.value));
        name.addEventListener("keydown", (event) => {
          if (event.key === "Enter") name.blur(); // blurring commits: "change"
        });
        name.addEventListener("focus", () => {
          this.activeId = object.id;
          this.renderPrompts();
        });
        const meta = element("span", "meta");
        const frames = session ? session.framesWith(object.id) : 0;
        const prompted = [...object.prompts.keys()].sort((a, b) => a - b);
        meta.textContent =
          `${frames} frame${frames === 1 ? "" : "s"} with a mask · ` +
          (object.phrase ? `found by SAM 3 ("${object.phrase}")${handedOver(object)} · ` : "") +
          `prompts on ${prompted.length ? prompted.join(", ") : "none"}`;
        const eye = button(object.visible ? "◉" : "○", "hide / show (h)", () =>
          this.toggleVisible(object.id),
        );
        const remove = button("✕", "delete (Del)", () => this.remove(object.id));
        item.append(swatch, name, eye, remove, meta);
        item.addEventListener("click", (event) => {
          if (event.target === item || event.target === swatch || event.target === meta) {
            this.activate(object.id);
          }
        });
        return item;
      }),
    );
  }

  // ------------------------------------------------------------------------- input

  /** The page's key, in video mode: true when it was the player's. */
  key(event) {
    const big = event.shiftKey ? BIG_STEP : 1;
    const actions = {
      ArrowLeft: () => this.step(-big),
      ArrowRight: () => this.step(big),
      ",": () => this.step(-1),
      ".": () => this.step(1),
      Home: () => this.show(0),
      End: () => this.show((this.session?.numFrames ?? 1) - 1),
      " ": () => this.togglePlay(),
      f: () => this.propagate(false),
      t: () => this.finder.focus() || this.say("This server does not run concepts (serve --concepts)."),
      g: () => this.refine(),
      b: () => this.propagate(true),
      Escape: () => (this.run ? this.stop() : this.pause()),
      n: () => this.newObject(),
      r: () => this.activeId !== null && this.focusName(),
      h: () => this.activeId !== null && this.toggleVisible(this.activeId),
      Delete: () => this.activeId !== null && this.remove(this.activeId),
      Backspace: () => this.activeId !== null && this.remove(this.activeId),
      e: () => this.export("coco"),
      y: () => this.export("youtube_vis"),
    };
    if (/^[1-9]$/.test(event.key)) {
      const object = this.objects[Number(event.key) - 1];
      if (object) this.activate(object.id);
      return true;
    }
    const action = actions[event.key] ?? actions[event.key.toLowerCase()];
    if (!action) return false;
    action();
    return true;
  }

  wire() {
    $("#video-prev").addEventListener("click", () => this.step(-1));
    $("#video-next").addEventListener("click", () => this.step(1));
    $("#video-play").addEventListener("click", () => this.togglePlay());
    $("#video-slider").addEventListener("input", () => {
      this.pause();
      this.show(Number($("#video-slider").value));
    });
    $("#propagate").addEventListener("click", () => this.propagate(false));
    $("#propagate-back").addEventListener("click", () => this.propagate(true));
    $("#propagate-stop").addEventListener("click", () => this.stop());
    this.finder.wire();
    $("#export-video-coco").addEventListener("click", () => this.export("coco"));
    $("#export-ytvis").addEventListener("click", () => this.export("youtube_vis"));
  }
}

/** What the object list says of a found object's tracker. */
function handedOver(object) {
  if (object.tracker !== "sam3") return ", SAM 2.1's since a click";
  const waiting = [...(object.refine?.values() ?? [])].reduce((sum, points) => sum + points.length, 0);
  return waiting
    ? `, ${waiting} click${waiting === 1 ? "" : "s"} to refine with SAM 3 (g)`
    : ", clicks refine it with SAM 3 (g), Alt+click hands it to SAM 2.1";
}
