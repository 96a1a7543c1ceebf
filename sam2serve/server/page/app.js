// The annotation page: open an image, encode it once (POST /v1/embeddings), then every
// click, negative click or box asks POST /v1/segment for the active object's mask by
// image_id, with the object's previous mask_id as its mask input (an object SAM 3 found is
// refined by SAM 3: "model": "sam3", concepts.js's segmentBody); "Everything" runs
// POST /v1/amg and opens a review; "Concepts" (when the server runs SAM 3) POST
// /v1/concepts and opens concepts.js's review; export goes through POST /v1/coco (the
// server's COCO writer) or to PNG masks made here. A video (a file, frame images, or a video of the
// server's folder) switches the page to player.js's video mode (where "Find in video" is
// video_concepts.js's, when the server runs concepts). Only the public API,
// with the person's API key.

import { Api, ApiError } from "./api.js";
import { ConceptPanel, segmentBody } from "./concepts.js";
import { button, element } from "./dom.js";
import { download, maskPng, zip } from "./files.js";
import { ObjectStore } from "./objects.js";
import { Player } from "./player.js";
import { Review } from "./review.js";
import { area, fromServer, toCoco } from "./rle.js";
import { record, stats } from "./timings.js";
import { Stage } from "./view.js";

const $ = (selector) => document.querySelector(selector);
const DRAG_PX = 5; // a pointer that moves more than this (on screen) draws a box
const ENCODE_ESTIMATE = "sam2serve.encodeMs";
const AMG_FIELDS = {
  points_per_side: "#amg-points-per-side",
  pred_iou_thresh: "#amg-pred-iou",
  stability_score_thresh: "#amg-stability",
  box_nms_thresh: "#amg-box-nms",
  min_mask_region_area: "#amg-min-area",
  crop_n_layers: "#amg-crop-layers",
};
const INTEGER_FIELDS = new Set(["points_per_side", "min_mask_region_area", "crop_n_layers"]);
// A video file, by type or (when the browser does not know the type) by extension.
const VIDEO_FILE = /\.(mp4|m4v|mov|mkv|avi|webm|gif)$/i;
// The page's keys that also work in video mode (the others are the image mode's).
const KEYS_IN_VIDEO = new Set(["o", "v", "[", "]"]);
// The keys of concepts.js's review while it is open (before the page's own).
const CONCEPT_KEYS = new Set(["Enter", "Delete", "Backspace", "ArrowDown", "ArrowUp"]);

const api = new Api();
const stage = new Stage($("#stage"));
const store = new ObjectStore(() => render());
const state = {
  image: null, // {name, blob, width, height, imageId, token}
  review: null, // Review while AMG's masks are being reviewed
  amg: null, // AbortController of the AMG run in flight
  drag: null, // {x0, y0, x1, y1, start: {clientX, clientY}, label, boxing}
  inflight: new Set(), // object ids with a /v1/segment request in flight
  pending: new Map(), // object id -> time of the earliest click not yet answered
  retryAfterKey: null, // what to do again once the person gives the API key
  folder: { names: [], kinds: new Map(), total: 0, current: null },
};
let imageTokens = 0;
const concepts = new ConceptPanel({
  api,
  store,
  say,
  fail,
  busyNotice,
  image: () => state.image,
  render: () => render(),
  closeOtherReview: () => closeReview(),
});
const player = new Player({
  api,
  stage,
  say,
  fail,
  busyNotice,
  setState: (text) => ($("#image-state").textContent = text),
});

// --------------------------------------------------------------------------- messages

function say(text, level = "info") {
  const message = $("#message");
  message.textContent = text;
  message.dataset.level = level;
}

function busyNotice(what) {
  return (error, seconds, attempt) =>
    say(
      `Server busy (${error.status} ${error.code}): ${what} again in ${seconds.toFixed(1)} s ` +
        `(attempt ${attempt + 1}).`,
      "busy",
    );
}

/** Tell the person what went wrong; 401 asks for the key and keeps `retry` for later. */
function fail(error, what, retry = null) {
  if (error?.name === "AbortError") return;
  if (!(error instanceof ApiError)) {
    say(`${what} failed: ${error?.message ?? error}`, "error");
    console.error(error);
    return;
  }
  if (error.status === 401) {
    state.retryAfterKey = retry;
    $("#api-key").classList.add("attention");
    $("#api-key").focus();
    say("This server needs an API key: type it in the API key field and press Enter.", "error");
  } else if (error.busy) {
    const wait = error.retryAfter ? ` (it suggests ${error.retryAfter} s)` : "";
    say(`Server busy: ${what} was not done: ${error.message}. Try again in a moment${wait}.`, "error");
  } else if (error.status === 0) {
    say(`${what}: ${error.message}.`, "error");
  } else {
    say(`${what}: the server refused it: ${error.describe()}`, "error");
  }
}

// --------------------------------------------------------------------------- rendering

function render() {
  if (player.active) return player.render();
  const instances = concepts.candidates(store.objects);
  stage.renderMasks(store.objects, [...(state.review?.candidates ?? []), ...instances]);
  const boxing = state.drag?.boxing ? state.drag : null;
  stage.renderPrompts(store.objects, store.activeId, boxing?.exemplar ? null : boxing);
  stage.renderInstances(instances);
  concepts.exemplars.draw(stage, boxing);
  renderObjects();
  renderReview();
  concepts.render(store.objects);
  const ready = Boolean(state.image?.imageId);
  $("#amg").disabled = !ready || state.amg !== null;
  $("#amg-cancel").hidden = state.amg === null;
  $("#export-coco").disabled = !store.objects.some((object) => object.mask);
  $("#export-png").disabled = $("#export-coco").disabled;
}

function renderObjects() {
  const list = $("#object-list");
  list.replaceChildren(
    ...store.objects.map((object, index) => {
      const item = document.createElement("li");
      item.dataset.id = object.id;
      item.classList.toggle("active", object.id === store.activeId);
      item.classList.toggle("hidden-object", !object.visible);
      const swatch = element("span", "swatch");
      swatch.style.background = object.colour;
      const name = element("input", "name");
      name.value = object.name;
      name.title = `Object ${index + 1}: its name is its COCO category`;
      name.addEventListener("input", () => (object.name = name.value));
      name.addEventListener("focus", () => activateQuietly(object.id));
      const meta = element("span", "meta");
      meta.textContent = object.mask
        ? `${area(object.mask)} px${object.score != null ? ` · ${object.score.toFixed(2)}` : ""}`
        : "no mask";
      const eye = button(object.visible ? "◉" : "○", "hide / show (h)", () =>
        store.set(object.id, { visible: !object.visible }),
      );
      const remove = button("✕", "delete (Del)", () => store.remove([object.id]));
      item.append(swatch, name, eye, remove, meta);
      item.addEventListener("click", (event) => {
        if (event.target === item || event.target === swatch || event.target === meta) {
          store.activate(object.id);
        }
      });
      return item;
    }),
  );
}

/** Make an object active without rebuilding the list (its name field keeps the focus). */
function activateQuietly(id) {
  if (store.activeId === id) return;
  store.activeId = id;
  for (const item of $("#object-list").children) {
    item.classList.toggle("active", Number(item.dataset.id) === id);
  }
  stage.renderPrompts(store.objects, store.activeId);
}

function renderReview() {
  const review = state.review;
  $("#review").hidden = review === null;
  if (!review) return;
  $("#review-count").textContent = `${review.candidates.length} masks`;
  $("#candidate-list").replaceChildren(
    ...review.candidates.map((candidate) => {
      const item = document.createElement("li");
      item.classList.toggle("selected", candidate.selected);
      const box = element("input");
      box.type = "checkbox";
      box.checked = candidate.selected;
      const swatch = element("span", "swatch");
      swatch.style.background = candidate.colour;
      const meta = element("span", "meta");
      meta.textContent = `#${candidate.index + 1} · ${candidate.area} px · IoU ${candidate.score.toFixed(2)}`;
      item.append(box, swatch, meta);
      item.addEventListener("click", () => {
        review.toggle(candidate);
        render();
      });
      return item;
    }),
  );
}

function showTiming(entry) {
  const { n, p50, p90 } = stats("click");
  const server = entry.server_ms != null ? ` (server ${entry.server_ms.toFixed(0)} ms)` : "";
  $("#timing").textContent =
    `click → mask ${entry.ms.toFixed(0)} ms${server} · p50 ${p50.toFixed(0)} ms · ` +
    `p90 ${p90.toFixed(0)} ms · n=${n}`;
}

// --------------------------------------------------------------------------- the image

function setImageState(text, phase) {
  $("#image-state").textContent = text;
  document.body.dataset.image = phase;
}

async function openImage(blob, name) {
  cancelAmg();
  if (player.active) player.close();
  let bitmap;
  try {
    bitmap = await createImageBitmap(blob, { imageOrientation: "from-image" });
  } catch {
    say(`This browser cannot show ${name}; open a JPEG, PNG, WebP or BMP file.`, "error");
    return;
  }
  state.review = null;
  concepts.close();
  concepts.exemplars.clear(); // they were this image's pixels
  state.pending.clear();
  store.clear();
  stage.setImage(bitmap);
  $("#drop-hint").hidden = true;
  state.image = { name, blob, width: bitmap.width, height: bitmap.height, imageId: null };
  state.image.conceptsId = null; // the image_id of its SAM 3 encoding (concepts.js)
  state.image.token = ++imageTokens;
  markFolder(name);
  render();
  await encode();
}

/** POST /v1/embeddings: the image's embedding cached on the server, its image_id here. */
async function encode() {
  const image = state.image;
  const started = performance.now();
  const estimate = Number(sessionStorage.getItem(ENCODE_ESTIMATE)) || 0;
  const progress = $("#encode-progress");
  progress.hidden = false;
  progress.removeAttribute("value");
  const tick = () => {
    const seconds = (performance.now() - started) / 1000;
    setImageState(`Encoding ${image.name}… ${seconds.toFixed(1)} s`, "encoding");
    if (estimate) progress.value = Math.min(0.95, (seconds * 1000) / estimate);
  };
  tick();
  const timer = setInterval(tick, 100);
  say("");
  try {
    const form = new FormData();
    form.append("image", image.blob, image.name);
    const answer = await api.retrying(() => api.call("POST", "/v1/embeddings", { form }), {
      tries: 6,
      onWait: busyNotice("encoding"),
    });
    if (image !== state.image) return;
    if (answer.width !== image.width || answer.height !== image.height) {
      say(
        `The server reads this image as ${answer.width}×${answer.height}, the browser as ` +
          `${image.width}×${image.height}: masks may not line up.`,
        "error",
      );
    }
    image.imageId = answer.image_id;
    const ms = performance.now() - started;
    record("encode", ms, { server_ms: answer.inference_ms, queue_ms: answer.queue_ms });
    if (!answer.cached) sessionStorage.setItem(ENCODE_ESTIMATE, String(answer.inference_ms));
    const how = answer.cached ? "already encoded" : `encoded in ${(ms / 1000).toFixed(2)} s`;
    setImageState(`${image.name}: ${answer.width}×${answer.height}, ${how}`, "ready");
  } catch (error) {
    if (image !== state.image) return;
    setImageState(`${image.name}: not encoded`, "error");
    fail(error, `Encoding ${image.name}`, encode);
  } finally {
    clearInterval(timer);
    progress.hidden = true;
    render();
  }
}

// --------------------------------------------------------------------------- clicks

function addPrompt(prompt, clickedAt) {
  if (player.active) return player.addPrompt(prompt);
  if (!state.image?.imageId) {
    say(state.image ? "Wait until the image is encoded." : "Open an image first.", "info");
    return;
  }
  const object = store.active() ?? store.create();
  store.prompt(object.id, prompt);
  decode(object.id, clickedAt);
}

/** One /v1/segment request for the object's prompts (all its clicks, its box and its
 * previous mask as mask input). Clicks that arrive meanwhile wait for the answer and go
 * in the next request, so answers come in order. */
async function decode(id, clickedAt) {
  if (state.inflight.has(id)) {
    state.pending.set(id, Math.min(state.pending.get(id) ?? clickedAt, clickedAt));
    return;
  }
  const object = store.get(id);
  if (!object || !state.image?.imageId) return;
  state.inflight.add(id);
  const epoch = object.epoch;
  const prompt = { points: object.points.map(({ x, y, label }) => ({ x, y, label })) };
  if (object.box) prompt.box = object.box;
  if (object.maskId) prompt.mask_id = object.maskId;
  // One click alone is ambiguous: ask for SAM's 3 candidates and keep the best.
  const multimask = object.points.length === 1 && !object.box && !object.maskId;
  try {
    const answer = await segment(prompt, multimask, object.model);
    const best = answer.objects[0].masks.reduce((a, b) => (b.score > a.score ? b : a));
    const drawn = store.answer(id, epoch, {
      mask: fromServer(best.segmentation),
      maskId: best.mask_id,
      score: best.score,
    });
    if (drawn) {
      const entry = record("click", performance.now() - clickedAt, {
        server_ms: answer.inference_ms,
        queue_ms: answer.queue_ms,
      });
      showTiming(entry);
      if ($("#message").dataset.level !== "error") say("");
    }
  } catch (error) {
    if (store.get(id)?.epoch === epoch) fail(error, "Segmenting");
  } finally {
    state.inflight.delete(id);
    if (state.pending.has(id)) {
      const earliest = state.pending.get(id);
      state.pending.delete(id);
      decode(id, earliest);
    }
  }
}

/** POST /v1/segment by image_id (SAM 2.1's, or SAM 3's for `model` "sam3": segmentBody);
 * a mask input or an encoding the server no longer has is dropped or sent again, and busy
 * answers are retried. */
async function segment(prompt, multimask, model = "sam2") {
  const image = state.image;
  const sam3 = model === "sam3";
  try {
    const send = async () =>
      api.call("POST", "/v1/segment", { json: await segmentBody(image, prompt, multimask, model) });
    const answer = await api.retrying(send, { onWait: busyNotice("asking") });
    if (sam3) image.conceptsId = answer.image_id; // SAM 3's encoding is on the server now
    return answer;
  } catch (error) {
    if (error.code === "unknown_mask_id" && prompt.mask_id) {
      delete prompt.mask_id; // the server forgot the previous mask: the clicks alone
      return segment(prompt, multimask, model);
    }
    if (error.code === "unknown_image_id" && sam3 && image.conceptsId) {
      image.conceptsId = null; // SAM 3's encoding was evicted: the image goes with the click
      return segment(prompt, multimask, model);
    }
    if (error.code === "unknown_image_id" && !sam3 && image === state.image) {
      say("The server evicted this image: encoding it again.", "busy");
      image.imageId = null;
      await encode();
      if (image.imageId && image === state.image) return segment(prompt, multimask, model);
    }
    throw error;
  }
}

function onPointerDown(event) {
  if (!stage.width || event.button > 2) return;
  event.preventDefault();
  stage.prompts.setPointerCapture(event.pointerId);
  const at = stage.toImage(event);
  const label = event.button === 2 || event.shiftKey ? 0 : 1;
  const exemplar = !player.active && concepts.exemplars.drawing; // exemplars.js's drag
  state.drag = { x0: at.x, y0: at.y, x1: at.x, y1: at.y, start: event, label, boxing: false };
  state.drag.exemplar = exemplar;
  state.drag.sam2 = event.altKey; // video: on an object SAM 3 found, hand it to SAM 2.1
}

function onPointerMove(event) {
  const drag = state.drag;
  if (!drag) return;
  const moved = Math.hypot(event.clientX - drag.start.clientX, event.clientY - drag.start.clientY);
  const boxes = drag.label === 1 || drag.exemplar; // a negative exemplar is a Shift-drag
  if (moved > DRAG_PX && boxes && !state.review && !concepts.reviewing) {
    drag.boxing = true;
  }
  if (!drag.boxing) return;
  const at = stage.toImage(event);
  Object.assign(drag, { x1: at.x, y1: at.y });
  if (player.active) player.renderPrompts(drag);
  else stage.renderPrompts(store.objects, store.activeId, drag.exemplar ? null : drag);
  if (drag.exemplar) concepts.exemplars.draw(stage, drag);
}

function onPointerUp(event) {
  const drag = state.drag;
  if (!drag) return;
  state.drag = null;
  const clickedAt = performance.now();
  if (state.review) {
    const at = stage.toImage(event);
    const candidate = state.review.at(at.x, at.y);
    if (candidate) state.review.toggle(candidate);
    render();
    return;
  }
  if (concepts.reviewing) {
    const at = stage.toImage(event);
    concepts.pick(at.x, at.y);
    render();
    return;
  }
  if (drag.exemplar) {
    concepts.exemplars.finish(drag);
    render();
    return;
  }
  if (drag.boxing) {
    const box = [
      Math.min(drag.x0, drag.x1),
      Math.min(drag.y0, drag.y1),
      Math.max(drag.x0, drag.x1),
      Math.max(drag.y0, drag.y1),
    ];
    addPrompt({ box }, clickedAt);
  } else {
    addPrompt({ point: { x: drag.x0, y: drag.y0, label: drag.label }, sam2: drag.sam2 }, clickedAt);
  }
  render();
}

// --------------------------------------------------------------------------- AMG

function amgParams() {
  const params = {};
  for (const [name, selector] of Object.entries(AMG_FIELDS)) {
    const text = $(selector).value.trim();
    if (text === "") continue;
    const value = Number(text);
    params[name] = INTEGER_FIELDS.has(name) ? Math.round(value) : value;
  }
  return params;
}

/** POST /v1/amg with the image: every mask, then the review. */
async function runAmg() {
  const image = state.image;
  if (!image?.imageId || state.amg) return;
  concepts.close();
  const controller = new AbortController();
  state.amg = controller;
  document.body.dataset.amg = "running";
  const started = performance.now();
  const tick = () =>
    say(`Everything: finding every mask… ${((performance.now() - started) / 1000).toFixed(1)} s`, "busy");
  tick();
  const timer = setInterval(tick, 200);
  render();
  try {
    const form = new FormData();
    form.append("image", image.blob, image.name);
    form.append("request", JSON.stringify({ params: amgParams(), mask_format: "uncompressed_rle" }));
    const answer = await api.retrying(
      () => api.call("POST", "/v1/amg", { form, signal: controller.signal }),
      { onWait: busyNotice("AMG"), signal: controller.signal },
    );
    if (image !== state.image) return;
    const ms = performance.now() - started;
    record("amg", ms, { server_ms: answer.inference_ms, queue_ms: answer.queue_ms });
    state.review = new Review(answer.masks);
    const seconds = (ms / 1000).toFixed(1);
    say(
      state.review.empty
        ? `AMG found no mask in ${seconds} s (lower the thresholds under Advanced).`
        : `AMG found ${answer.masks.length} masks in ${seconds} s: click them to select, then ` +
            "Accept (Enter), Merge (m) or Reject (Del).",
    );
    if (state.review.empty) state.review = null;
  } catch (error) {
    if (error?.name === "AbortError") say("AMG cancelled.");
    else fail(error, "AMG", runAmg);
  } finally {
    clearInterval(timer);
    if (state.amg === controller) state.amg = null;
    document.body.dataset.amg = "idle";
    render();
  }
}

function cancelAmg() {
  state.amg?.abort();
}

function acceptSelected() {
  const chosen = state.review?.selected() ?? [];
  if (!chosen.length) return say("Select masks first (click them).");
  store.record([]);
  for (const candidate of chosen) store.create(Review.objectOf(candidate), { record: false });
  finishReviewStep(chosen, `Accepted ${chosen.length} mask${chosen.length > 1 ? "s" : ""} as objects.`);
}

function mergeSelected() {
  const chosen = state.review?.selected() ?? [];
  if (chosen.length < 2) return say("Select two masks or more to merge them.");
  store.record([]);
  store.create(Review.mergedOf(chosen), { record: false });
  finishReviewStep(chosen, `Merged ${chosen.length} masks into one object.`);
}

function rejectSelected() {
  const chosen = state.review?.selected() ?? [];
  if (!chosen.length) return say("Select masks first (click them).");
  finishReviewStep(chosen, `Rejected ${chosen.length} mask${chosen.length > 1 ? "s" : ""}.`);
}

function finishReviewStep(chosen, message) {
  state.review.drop(chosen);
  if (state.review.empty) state.review = null;
  say(state.review ? `${message} ${state.review.candidates.length} masks left to review.` : message);
  render();
}

function closeReview() {
  if (!state.review) return;
  state.review = null;
  say("");
  render();
}

// --------------------------------------------------------------------------- export

function stem() {
  return (state.image?.name ?? "image").replace(/\.[^.]+$/, "");
}

function labelled() {
  return store.objects.filter((object) => object.mask);
}

/** The accepted objects as a COCO file, written by the server's COCO writer. */
async function exportCoco() {
  const objects = labelled();
  if (!objects.length) return say("Nothing to export yet: no object has a mask.");
  const image = state.image;
  const body = {
    images: [
      {
        file_name: image.name,
        width: image.width,
        height: image.height,
        objects: objects.map((object) => ({
          name: object.name.trim() || "object",
          segmentation: toCoco(object.mask),
          score: object.score,
        })),
      },
    ],
  };
  try {
    const coco = await api.retrying(() => api.call("POST", "/v1/coco", { json: body }), {
      onWait: busyNotice("exporting"),
    });
    const text = JSON.stringify(coco, null, 1);
    download(new Blob([text], { type: "application/json" }), `${stem()}_coco.json`);
    say(`Exported ${objects.length} objects as COCO JSON (${stem()}_coco.json).`);
  } catch (error) {
    fail(error, "Exporting COCO", exportCoco);
  }
}

/** One PNG per object (255 on the mask), in a ZIP. */
async function exportPngs() {
  const objects = labelled();
  if (!objects.length) return say("Nothing to export yet: no object has a mask.");
  const entries = [];
  for (const [index, object] of objects.entries()) {
    const name = object.name.trim().replace(/[^\w.-]+/g, "_") || "object";
    entries.push({ name: `${String(index + 1).padStart(2, "0")}_${name}.png`, blob: await maskPng(object.mask) });
  }
  download(await zip(entries), `${stem()}_masks.zip`);
  say(`Exported ${objects.length} PNG masks (${stem()}_masks.zip).`);
}

// --------------------------------------------------------------------------- folder

async function loadFolder(offset = 0) {
  try {
    const page = await api.call("GET", `/v1/images?offset=${offset}&limit=1000`);
    state.folder.names = offset ? [...state.folder.names, ...page.images.map((i) => i.name)]
      : page.images.map((entry) => entry.name);
    for (const entry of page.images) state.folder.kinds.set(entry.name, entry.kind ?? "image");
    state.folder.total = page.total;
    $("#folder").hidden = false;
    $("#folder-name").textContent = `${page.folder} · ${page.total}`;
    renderFolder();
    stage.fit();
    render();
  } catch (error) {
    if (error instanceof ApiError && error.code === "no_image_folder") return;
    fail(error, "Listing the image folder", () => loadFolder(offset));
  }
}

function renderFolder() {
  const filter = $("#folder-filter").value.trim().toLowerCase();
  $("#folder-list").replaceChildren(
    ...state.folder.names
      .filter((name) => name.toLowerCase().includes(filter))
      .map((name) => {
        const item = element("li");
        item.textContent = name;
        item.title = name;
        item.classList.toggle("video", state.folder.kinds.get(name) === "video");
        item.classList.toggle("frames", state.folder.kinds.get(name) === "frames");
        item.classList.toggle("current", name === state.folder.current);
        item.addEventListener("click", () => openFromFolder(name));
        return item;
      }),
  );
  $("#folder-more").hidden = state.folder.names.length >= state.folder.total;
}

function markFolder(name) {
  state.folder.current = state.folder.names.includes(name) ? name : null;
  renderFolder();
}

async function openFromFolder(name) {
  if (state.folder.kinds.get(name) === "frames") return openFramesFolder(name);
  try {
    setImageState(`Loading ${name}…`, "loading");
    const query = new URLSearchParams({ name });
    const blob = await api.retrying(() => api.call("GET", `/v1/images/file?${query}`));
    if (state.folder.kinds.get(name) === "video") {
      await openVideo({ video: blob }, name);
      markFolder(name);
      return;
    }
    await openImage(blob, name);
  } catch (error) {
    setImageState(`${name}: not loaded`, "error");
    fail(error, `Opening ${name}`, () => openFromFolder(name));
  }
}

/** A subfolder of the server's folder: a video given as its frames (its image files, in
 * the order of their names), fetched one by one and uploaded as the video's frames. */
async function openFramesFolder(folder) {
  try {
    setImageState(`Listing ${folder}…`, "loading");
    const names = [];
    for (let total = Infinity; names.length < total; ) {
      const query = new URLSearchParams({ folder, offset: names.length, limit: 10000 });
      const page = await api.retrying(() => api.call("GET", `/v1/images?${query}`));
      names.push(...page.images.map((entry) => entry.name));
      total = page.images.length ? page.total : names.length;
    }
    if (!names.length) return say(`${folder} has no image files: no frames to open.`, "error");
    names.sort((a, b) => a.localeCompare(b, undefined, { numeric: true }));
    const frames = [];
    for (const name of names) {
      setImageState(`Loading ${folder}: frame ${frames.length + 1} / ${names.length}…`, "loading");
      const query = new URLSearchParams({ folder, name });
      const blob = await api.retrying(() => api.call("GET", `/v1/images/file?${query}`));
      frames.push(new File([blob], name, { type: blob.type }));
    }
    await openVideo({ frames }, folder);
    markFolder(folder);
  } catch (error) {
    setImageState(`${folder}: not loaded`, "error");
    fail(error, `Opening ${folder}`, () => openFramesFolder(folder));
  }
}

function stepFolder(step) {
  const names = state.folder.names;
  if (!names.length) return;
  const at = names.indexOf(state.folder.current);
  const next = at < 0 ? 0 : Math.min(names.length - 1, Math.max(0, at + step));
  if (names[next] !== state.folder.current) openFromFolder(names[next]);
}

// --------------------------------------------------------------------------- video

function isVideo(file) {
  return file.type.startsWith("video/") || VIDEO_FILE.test(file.name);
}

/** A video file, or several images: the frames of one video, in the order of their names. */
function openVideoFiles(files) {
  const video = files.find(isVideo);
  if (video) return openVideo({ video }, video.name);
  const frames = files.filter((file) => file.type.startsWith("image/"));
  if (!frames.length) return say("Open a video file (MP4, WebM, MOV, …) or its frames (images).", "error");
  frames.sort((a, b) => a.name.localeCompare(b.name, undefined, { numeric: true }));
  const folder = frames[0].webkitRelativePath?.split("/")[0];
  return openVideo({ frames }, folder || `${frames[0].name.replace(/\.[^.]+$/, "")}_frames`);
}

/** Leave the image (its review, AMG, objects) and open the video in the player. */
async function openVideo(source, name) {
  cancelAmg();
  state.review = null;
  concepts.close();
  state.pending.clear();
  state.image = null;
  store.clear();
  await player.open(source, name);
}

// --------------------------------------------------------------------------- keyboard

const KEYS = {
  n: newObject,
  z: undo,
  a: runAmg,
  e: exportCoco,
  p: exportPngs,
  o: () => $("#file").click(),
  v: () => $("#video-file").click(),
  m: mergeSelected,
  h: () => store.active() && store.set(store.activeId, { visible: !store.active().visible }),
  "[": () => stepFolder(-1),
  "]": () => stepFolder(1),
  t: focusConcepts,
  b: () => concepts.exemplars.toggle(),
  Enter: acceptSelected,
  Delete: removeOrReject,
  Backspace: removeOrReject,
  Escape: escape,
};

/** A new object, unless the active one has no prompt yet (it is the new one). */
function newObject() {
  if (player.active) return player.newObject();
  const active = store.active();
  if (active && !active.points.length && !active.box && !active.mask) {
    return say(`${active.name} has no prompt yet: click on the image to make its mask.`);
  }
  store.create();
}

function focusConcepts() {
  if (!concepts.enabled) return say("This server does not run concepts (serve --concepts).");
  $("#concept-text").focus();
  $("#concept-text").select();
}

function undo() {
  if (!store.undo()) say("Nothing to undo.");
}

function removeOrReject() {
  if (state.review) rejectSelected();
  else if (store.activeId !== null) store.remove([store.activeId]);
}

function escape() {
  if (state.drag) {
    state.drag = null;
    render();
  } else if (state.amg) {
    cancelAmg();
  } else if (concepts.running) {
    concepts.cancel();
  } else if (state.review) {
    state.review.selectAll(false);
    render();
  } else if (concepts.exemplars.drawing) {
    concepts.exemplars.toggle(false);
  }
}

function onKey(event) {
  const typing = event.target.closest?.("input, textarea, select");
  if (typing && event.key !== "Escape") return;
  if (typing) event.target.blur();
  if (player.active) {
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    if (player.key(event)) return event.preventDefault();
    if (!KEYS_IN_VIDEO.has(event.key)) return;
  }
  if (concepts.reviewing && CONCEPT_KEYS.has(event.key) && !event.ctrlKey && !event.metaKey) {
    event.preventDefault();
    if (concepts.key(event)) return;
  }
  if ((event.ctrlKey || event.metaKey) && event.key.toLowerCase() === "z") {
    event.preventDefault();
    return undo();
  }
  if (event.ctrlKey || event.metaKey || event.altKey) return;
  if (/^[1-9]$/.test(event.key)) {
    const object = store.objects[Number(event.key) - 1];
    if (object) store.activate(object.id);
    return;
  }
  const action = KEYS[event.key] ?? KEYS[event.key.toLowerCase()];
  if (action) {
    event.preventDefault();
    action();
  }
}

// --------------------------------------------------------------------------- start

function wire() {
  const prompts = stage.prompts;
  prompts.addEventListener("pointerdown", onPointerDown);
  prompts.addEventListener("pointermove", onPointerMove);
  prompts.addEventListener("pointerup", onPointerUp);
  prompts.addEventListener("contextmenu", (event) => event.preventDefault());
  document.addEventListener("keydown", onKey);
  window.addEventListener("pagehide", () => player.close());
  window.addEventListener("resize", () => {
    stage.fit();
    render();
  });

  $("#open").addEventListener("click", () => $("#file").click());
  $("#open-video").addEventListener("click", () => $("#video-file").click());
  $("#video-file").addEventListener("change", () => {
    openVideoFiles([...$("#video-file").files]);
    $("#video-file").value = "";
  });
  $("#file").addEventListener("change", () => {
    const file = $("#file").files[0];
    if (file) openImage(file, file.name);
    $("#file").value = "";
  });
  const wrap = $("#stage-wrap");
  wrap.addEventListener("dragover", (event) => {
    event.preventDefault();
    wrap.classList.add("dragging");
  });
  wrap.addEventListener("dragleave", () => wrap.classList.remove("dragging"));
  wrap.addEventListener("drop", (event) => {
    event.preventDefault();
    wrap.classList.remove("dragging");
    const files = [...event.dataTransfer.files];
    const images = files.filter((f) => f.type.startsWith("image/") && !isVideo(f));
    if (files.some(isVideo) || images.length > 1) openVideoFiles(files);
    else if (images.length) openImage(images[0], images[0].name);
    else say("Drop an image file (JPEG, PNG, WebP, BMP), a video, or a video's frames.", "error");
  });

  $("#key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    api.setKey($("#api-key").value);
    $("#api-key").classList.remove("attention");
    say(api.key ? "API key set for this tab." : "API key cleared.");
    const retry = state.retryAfterKey;
    state.retryAfterKey = null;
    retry?.();
  });
  $("#api-key").value = api.key;

  $("#new-object").addEventListener("click", newObject);
  $("#amg").addEventListener("click", runAmg);
  $("#amg-cancel").addEventListener("click", cancelAmg);
  $("#accept").addEventListener("click", acceptSelected);
  $("#merge").addEventListener("click", mergeSelected);
  $("#reject").addEventListener("click", rejectSelected);
  $("#select-all").addEventListener("click", () => {
    const review = state.review;
    review?.selectAll(review.selected().length < review.candidates.length);
    render();
  });
  $("#review-done").addEventListener("click", closeReview);
  $("#export-coco").addEventListener("click", exportCoco);
  $("#export-png").addEventListener("click", exportPngs);
  $("#folder-filter").addEventListener("input", renderFolder);
  concepts.wire();
  $("#folder-more").addEventListener("click", () => loadFolder(state.folder.names.length));
}

/** GET /readyz (open): what the server runs, or that it is still warming up. */
async function showModel() {
  try {
    const ready = await api.call("GET", "/readyz");
    $("#model").textContent = `${ready.model} · ${ready.mode} · ${ready.device}`;
    if (ready.weights?.source === "random") $("#model").textContent += " · RANDOM WEIGHTS";
    concepts.enable(ready.concepts === true);
    player.finder.enable(ready.concepts === true);
    concepts.exemplars.setLimits(ready);
  } catch (error) {
    $("#model").textContent = error.status === 503 ? "warming up…" : "server unreachable";
    setTimeout(showModel, 1000);
  }
}

wire();
render();
showModel();
loadFolder();
