// Concept prompts (SAM 3): the person types noun phrases ("cat, dog"), POST /v1/concepts
// finds every instance of each on the image (sent once; later searches name it by the
// image_id the answer gave, which is SAM 2.1's id of the same image too), and a review
// shows them, a colour per phrase with their scores. An accepted instance becomes an
// object named by its phrase (its COCO category) whose box is its box prompt: a click on it
// later refines it through /v1/segment with "model": "sam3" (SAM 3's tracker heads on the
// same SAM 3 encoding, segmentBody). A rejected one is dropped.
//
// While the review is open, a click on the image picks the instance under it; Enter accepts
// the current instance, Del rejects it, ↑/↓ move, Shift+Enter accepts every one left; Done
// closes the review (the undecided instances are dropped). Exemplar boxes drawn on the
// image (exemplars.js) go with the phrases, or alone.

import { button, element } from "./dom.js";
import { ExemplarPanel } from "./exemplars.js";
import { contains, fromServer } from "./rle.js";

export const PHRASE_COLOURS = [
  "#ffe119", "#00e5ff", "#ff4fd8", "#7cff4f", "#ff9f1c", "#b28dff", "#ff5a5a", "#4fffc4",
];
const $ = (selector) => document.querySelector(selector);

let instanceIds = 0;

/** The phrases of the text box: comma-separated, trimmed, empty ones and repeats dropped. */
export function parsePhrases(text) {
  const phrases = text.split(",").map((phrase) => phrase.trim()).filter(Boolean);
  return [...new Set(phrases)];
}

/** A COCO bbox [x, y, w, h] as the [x0, y0, x1, y1] box prompt /v1/segment takes. */
export function boxOf([x, y, w, h]) {
  return [x, y, x + w, y + h];
}

/** The instances of one /v1/concepts answer, waiting for the person's decision. An
 * instance is accepted while an object made from it exists (undo or deleting the object
 * makes it undecided again), rejected once the person says so. */
export class ConceptReview {
  constructor(answer) {
    this.phrases = answer.concepts.map((concept) => concept.phrase);
    this.instances = answer.concepts.flatMap((concept, p) =>
      concept.instances.map((instance, rank) => ({
        id: ++instanceIds,
        phrase: concept.phrase,
        rank, // 0: the phrase's highest score
        colour: PHRASE_COLOURS[p % PHRASE_COLOURS.length],
        score: instance.score,
        box: instance.area > 0 ? boxOf(instance.bbox) : null, // an empty mask has no box
        area: instance.area,
        mask: fromServer(instance.segmentation),
        rejected: false,
      })),
    );
    this.currentId = this.instances[0]?.id ?? null;
  }

  /** How many instances each phrase found, in the phrases' order. */
  counts() {
    return this.phrases.map((phrase) => ({
      phrase,
      found: this.instances.filter((instance) => instance.phrase === phrase).length,
    }));
  }

  /** The instances neither accepted (an object of `objects` has it) nor rejected. */
  undecided(objects) {
    const accepted = new Set(objects.map((object) => object.conceptId).filter(Boolean));
    return this.instances.filter((instance) => !instance.rejected && !accepted.has(instance.id));
  }

  current(objects) {
    const left = this.undecided(objects);
    return left.find((instance) => instance.id === this.currentId) ?? left[0] ?? null;
  }

  /** Move the current instance `step` places among the undecided ones. */
  move(objects, step) {
    const left = this.undecided(objects);
    if (!left.length) return;
    const at = left.findIndex((instance) => instance.id === this.current(objects)?.id);
    this.currentId = left[Math.min(left.length - 1, Math.max(0, at + step))].id;
  }

  /** After `instance` was decided: the next undecided one in the list becomes current. */
  advance(objects, instance) {
    const index = this.instances.indexOf(instance);
    const left = this.undecided(objects);
    const next = left.find((other) => this.instances.indexOf(other) > index) ?? left.at(-1);
    this.currentId = next?.id ?? null;
  }

  /** The smallest undecided instance under image point (x, y), or null. */
  at(objects, x, y) {
    const hits = this.undecided(objects).filter((instance) => contains(instance.mask, x, y));
    return hits.reduce((a, b) => (b.area < a.area ? b : a), hits[0] ?? null);
  }

  /** The fields of the object an instance becomes. */
  static objectOf(instance) {
    return {
      name: instance.phrase,
      colour: instance.colour,
      mask: instance.mask,
      score: instance.score,
      box: instance.box,
      points: [],
      conceptId: instance.id,
      model: "sam3", // its clicks are answered by SAM 3, which found it
    };
  }
}

/** The /v1/segment body for one object's prompt: SAM 2.1's by the image's embedding id;
 * SAM 3's (`model` "sam3": an object made from a concept instance) by the id of the image's
 * SAM 3 encoding, or with the image itself when the server has none (never searched, or
 * evicted: the caller clears `image.conceptsId` then). */
export async function segmentBody(image, prompt, multimask, model) {
  const body = {
    objects: [prompt],
    multimask_output: multimask,
    best_mask_only: multimask, // the page keeps the best candidate: only it is sent
    mask_format: "uncompressed_rle",
  };
  if (model !== "sam3") return { image_id: image.imageId, ...body };
  const source = image.conceptsId
    ? { image_id: image.conceptsId }
    : { image: await base64Of(image.blob) };
  return { ...source, model: "sam3", ...body };
}

/** What a search asks for, in words: its phrases, and its exemplar boxes if any. */
export function describe(phrases, boxes) {
  const negative = boxes.filter((box) => !box.positive).length;
  const counted = boxes.length
    ? `${boxes.length} exemplar box${boxes.length > 1 ? "es" : ""}` +
      (negative ? ` (${negative} negative)` : "")
    : "";
  if (!phrases.length) return `the concept of ${counted}`;
  const named = phrases.map((phrase) => `"${phrase}"`).join(", ");
  return counted ? `${named} with ${counted}` : named;
}

/** The image's bytes as base64 (the "image" field of a JSON request). */
export async function base64Of(blob) {
  const url = await new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(blob);
  });
  return url.slice(url.indexOf(",") + 1);
}

/** The "Concepts" panel: the text box, the threshold, the request and the review.
 * `host` gives it the page's parts: api, store, say, fail, busyNotice, image() (the open
 * image: {name, blob, imageId, conceptsId, ...} or null), render() (the whole page) and
 * closeOtherReview() (AMG's review, which shares the clicks and keys). */
export class ConceptPanel {
  constructor(host) {
    this.host = host;
    this.review = null;
    this.running = null; // AbortController of the request in flight
    this.enabled = false;
    this.exemplars = new ExemplarPanel({
      say: host.say,
      render: host.render,
      image: host.image,
      enabled: () => this.enabled,
    });
  }

  get reviewing() {
    return this.review !== null;
  }

  /** Shown only when the server runs the concept model (its /readyz says so). */
  enable(enabled) {
    this.enabled = Boolean(enabled);
    $("#concepts").hidden = !this.enabled;
    if (!this.enabled) this.exemplars.drawing = false;
  }

  wire() {
    $("#concept-form").addEventListener("submit", (event) => {
      event.preventDefault();
      this.find();
    });
    const slider = $("#concept-thresh-slider");
    const number = $("#concept-thresh");
    slider.addEventListener("input", () => (number.value = slider.value));
    number.addEventListener("input", () => (slider.value = number.value));
    $("#concept-cancel").addEventListener("click", () => this.cancel());
    $("#concept-accept").addEventListener("click", () => this.accept());
    $("#concept-reject").addEventListener("click", () => this.reject());
    $("#concept-accept-all").addEventListener("click", () => this.acceptAll());
    $("#concept-done").addEventListener("click", () => this.close());
    this.exemplars.wire();
  }

  /** POST /v1/concepts for the typed phrases on the open image; opens the review. */
  async find() {
    const { say, fail, busyNotice } = this.host;
    const image = this.host.image();
    if (!image) return say("Open an image first.");
    const phrases = parsePhrases($("#concept-text").value);
    const exemplars = this.exemplars.set;
    const refused = exemplars.refusal(phrases);
    if (refused) return say(refused, "error");
    const boxes = exemplars.request();
    const thresh = Number($("#concept-thresh").value.trim() || "0.5");
    if (!Number.isFinite(thresh)) {
      return say("The score threshold is a number from 0 to 1.", "error");
    }
    this.cancel();
    this.host.closeOtherReview();
    const controller = new AbortController();
    this.running = controller;
    document.body.dataset.concepts = "running";
    const started = performance.now();
    const what = describe(phrases, boxes);
    say(`Finding ${what}…`, "busy");
    this.host.render();
    const request = { phrases, boxes, score_thresh: thresh, mask_format: "uncompressed_rle" };
    try {
      const answer = await this.request(image, request, controller, busyNotice);
      if (image !== this.host.image() || controller.signal.aborted) return;
      this.review = new ConceptReview(answer);
      const seconds = ((performance.now() - started) / 1000).toFixed(1);
      const found = this.review
        .counts()
        .map(({ phrase, found: n }) => `${n} × ${phrase}`)
        .join(", ");
      if (!this.review.instances.length) {
        this.review = null;
        say(`No instance of ${what} scored over ${thresh} (${seconds} s): lower the threshold.`);
      } else {
        say(`Found ${found} in ${seconds} s: Enter accepts, Del rejects, ↑/↓ move, or click.`);
        if (document.activeElement?.closest("#concept-form")) document.activeElement.blur();
      }
    } catch (error) {
      if (error?.name !== "AbortError") fail(error, "Finding concepts", () => this.find());
      else if (this.running === controller) say("Concept search cancelled."); // not replaced
    } finally {
      if (this.running === controller) this.running = null;
      document.body.dataset.concepts = this.review ? "review" : "idle";
      this.host.render();
    }
  }

  /** The request, retried while the server is busy: by the image's id once the server
   * has its SAM 3 encoding, else (or once it evicted it) with the image itself. */
  async request(image, request, controller, busyNotice) {
    const { api } = this.host;
    const ask = async () => {
      const json = image.conceptsId
        ? { image_id: image.conceptsId, ...request }
        : { image: await base64Of(image.blob), ...request };
      return api.retrying(
        () => api.call("POST", "/v1/concepts", { json, signal: controller.signal }),
        { onWait: busyNotice("finding concepts"), signal: controller.signal },
      );
    };
    let answer;
    try {
      answer = await ask();
    } catch (error) {
      if (error.code !== "unknown_image_id" || !image.conceptsId) throw error;
      image.conceptsId = null; // evicted: send the image again
      answer = await ask();
    }
    image.conceptsId = answer.image_id;
    return answer;
  }

  cancel() {
    this.running?.abort();
  }

  /** Drop the review (a new image, a video, AMG, or Done): undecided instances go. */
  close() {
    this.cancel();
    this.review = null;
    document.body.dataset.concepts = "idle";
    this.host.render();
  }

  accept(instance = null) {
    const review = this.review;
    const { store } = this.host;
    const chosen = instance ?? review?.current(store.objects);
    if (!chosen) return;
    store.create(ConceptReview.objectOf(chosen));
    review.advance(store.objects, chosen);
    this.decided(`Accepted ${chosen.phrase} (${chosen.score.toFixed(2)}) as an object.`);
  }

  reject(instance = null) {
    const review = this.review;
    const chosen = instance ?? review?.current(this.host.store.objects);
    if (!chosen) return;
    chosen.rejected = true;
    review.advance(this.host.store.objects, chosen);
    this.decided(`Rejected ${chosen.phrase} (${chosen.score.toFixed(2)}).`);
  }

  acceptAll() {
    const { store } = this.host;
    const left = this.review?.undecided(store.objects) ?? [];
    if (!left.length) return;
    store.record([]);
    for (const instance of left) store.create(ConceptReview.objectOf(instance), { record: false });
    this.decided(`Accepted ${left.length} instances as objects.`);
  }

  decided(message) {
    const left = this.review.undecided(this.host.store.objects).length;
    if (!left) {
      this.close();
      this.host.say(`${message} Every instance is decided: click an object to refine it.`);
    } else {
      this.host.say(`${message} ${left} left to review.`);
      this.host.render();
    }
  }

  /** A click on the image while reviewing: the instance under it becomes current. */
  pick(x, y) {
    const instance = this.review?.at(this.host.store.objects, x, y);
    if (instance) this.review.currentId = instance.id;
  }

  /** Keys while reviewing; true when the key was the review's. */
  key(event) {
    if (!this.review) return false;
    const objects = this.host.store.objects;
    if (event.key === "Enter" && event.shiftKey) this.acceptAll();
    else if (event.key === "Enter") this.accept();
    else if (event.key === "Delete" || event.key === "Backspace") this.reject();
    else if (event.key === "ArrowDown") this.move(objects, 1);
    else if (event.key === "ArrowUp") this.move(objects, -1);
    else return false;
    return true;
  }

  move(objects, step) {
    this.review.move(objects, step);
    this.host.render();
  }

  /** The undecided instances as masks to paint (largest first), the current one emphasised. */
  candidates(objects) {
    if (!this.review) return [];
    const current = this.review.current(objects);
    return this.review
      .undecided(objects)
      .map((instance) => ({ ...instance, selected: instance === current }))
      .sort((a, b) => b.area - a.area);
  }

  /** The panel's controls and list. */
  render(objects) {
    this.exemplars.render();
    $("#concept-find").disabled = !this.host.image() || this.running !== null;
    $("#concept-cancel").hidden = this.running === null;
    const review = this.review;
    $("#concept-review").hidden = review === null;
    if (!review) return;
    const left = review.undecided(objects);
    const current = review.current(objects);
    const rejected = review.instances.filter((instance) => instance.rejected).length;
    const accepted = review.instances.length - left.length - rejected;
    $("#concept-count").textContent =
      `${left.length} left · ${accepted} accepted · ${rejected} rejected`;
    $("#concept-list").replaceChildren(...left.map((instance) => this.row(instance, current)));
    $("#concept-list li.current")?.scrollIntoView({ block: "nearest" });
  }

  row(instance, current) {
    const item = element("li");
    item.dataset.id = instance.id;
    item.classList.toggle("current", instance === current);
    const swatch = element("span", "swatch");
    swatch.style.background = instance.colour;
    const phrase = element("span", "phrase");
    phrase.textContent = instance.phrase;
    const meta = element("span", "meta");
    meta.textContent = `${instance.score.toFixed(2)} · ${instance.area} px`;
    const yes = button("✓", "accept (Enter)", () => this.accept(instance));
    yes.classList.add("accept");
    const no = button("✕", "reject (Del)", () => this.reject(instance));
    no.classList.add("reject");
    item.append(swatch, phrase, meta, yes, no);
    item.addEventListener("click", () => {
      this.review.currentId = instance.id;
      this.host.render();
    });
    return item;
  }
}
