// Exemplar boxes for the concept search (SAM 3): with exemplar mode on (the button, or `b`),
// a drag on the image draws an example of the concept (positive, green dashed), a Shift-
// or right-drag an example of what it is not (negative, red dashed). They are listed under
// the Concepts box with a remove button and go with the phrases in POST /v1/concepts as
// `boxes` (image pixels, [x0, y0, x1, y1]); boxes alone are a search too (the server's
// phrase is then Meta's stand-in "visual"). They stay for the next search until removed or
// another image is opened. The server's limits come from its /readyz
// (`max_concept_phrases`, `max_concept_boxes`): the page refuses more, saying so, instead of
// sending a request the server would refuse.

import { button, element } from "./dom.js";

const $ = (selector) => document.querySelector(selector);
export const POSITIVE_COLOUR = "#22c55e";
export const NEGATIVE_COLOUR = "#ef4444";
const MIN_SIDE_PX = 1; // a box thinner than this (image pixels) is no example of anything

let exemplarIds = 0;

/** The exemplar boxes of the open image and the server's limits; no DOM. */
export class ExemplarSet {
  constructor() {
    this.boxes = []; // {id, box: [x0, y0, x1, y1], positive}
    this.limits = { phrases: null, boxes: null }; // null: the server did not say
  }

  /** The limits of a /readyz answer (numbers only; anything else: not known). */
  setLimits(ready) {
    const count = (value) => (Number.isInteger(value) && value > 0 ? value : null);
    this.limits = {
      phrases: count(ready?.max_concept_phrases),
      boxes: count(ready?.max_concept_boxes),
    };
  }

  get count() {
    return this.boxes.length;
  }

  /** Add the box dragged from (x0, y0) to (x1, y1) on a width x height image. Returns null
   * when it was added, else why not (a message for the person). */
  add(corners, positive, width, height) {
    const [ax, ay, bx, by] = corners.map(Number);
    if (![ax, ay, bx, by].every(Number.isFinite)) return "An exemplar box needs four numbers.";
    const clamp = (value, high) => Math.min(high, Math.max(0, value));
    const round = (value) => Math.round(value * 10) / 10;
    const box = [
      round(clamp(Math.min(ax, bx), width)),
      round(clamp(Math.min(ay, by), height)),
      round(clamp(Math.max(ax, bx), width)),
      round(clamp(Math.max(ay, by), height)),
    ];
    if (box[2] - box[0] < MIN_SIDE_PX || box[3] - box[1] < MIN_SIDE_PX) {
      return "An exemplar box needs some width and height: drag across the example.";
    }
    const limit = this.limits.boxes;
    if (limit !== null && this.boxes.length >= limit) {
      return (
        `This server takes at most ${limit} exemplar boxes per search (max_concept_boxes): ` +
        "remove one (✕) before drawing another."
      );
    }
    this.boxes.push({ id: ++exemplarIds, box, positive: Boolean(positive) });
    return null;
  }

  remove(id) {
    this.boxes = this.boxes.filter((exemplar) => exemplar.id !== id);
  }

  clear() {
    this.boxes = [];
  }

  /** Why a search with these phrases and boxes would be refused here, or null. */
  refusal(phrases) {
    const { phrases: most, boxes } = this.limits;
    if (most !== null && phrases.length > most) {
      return (
        `${phrases.length} phrases: this server takes at most ${most} per search ` +
        "(max_concept_phrases)."
      );
    }
    if (boxes !== null && this.boxes.length > boxes) {
      return (
        `${this.boxes.length} exemplar boxes: this server takes at most ${boxes} per search ` +
        "(max_concept_boxes); remove some."
      );
    }
    if (!phrases.length && !this.boxes.length) {
      return 'Type a phrase first, e.g. "cat" or "cat, dog", or draw an exemplar box (b).';
    }
    return null;
  }

  /** The request's `boxes` field (ExemplarBoxIn: {box, positive}). */
  request() {
    return this.boxes.map(({ box, positive }) => ({ box: [...box], positive }));
  }
}

/** Draw the exemplars (and an exemplar box being dragged: {x0, y0, x1, y1, label}) dashed,
 * green for positive, red for negative, each marked + or − in its corner. */
export function drawExemplars(context, boxes, unit, drag = null) {
  const shapes = boxes.map(({ box, positive }) => ({ box, positive }));
  if (drag) {
    const box = [
      Math.min(drag.x0, drag.x1),
      Math.min(drag.y0, drag.y1),
      Math.max(drag.x0, drag.x1),
      Math.max(drag.y0, drag.y1),
    ];
    shapes.push({ box, positive: drag.label === 1 });
  }
  if (!shapes.length) return;
  context.save();
  context.lineWidth = 2 * unit;
  context.setLineDash([6 * unit, 4 * unit]);
  context.font = `bold ${Math.round(14 * unit)}px system-ui, sans-serif`;
  context.textBaseline = "top";
  for (const { box, positive } of shapes) {
    const [x0, y0, x1, y1] = box;
    const colour = positive ? POSITIVE_COLOUR : NEGATIVE_COLOUR;
    context.strokeStyle = colour;
    context.strokeRect(x0, y0, x1 - x0, y1 - y0);
    context.fillStyle = colour;
    context.fillText(positive ? "+" : "−", x0 + 3 * unit, y0 + 2 * unit);
  }
  context.restore();
}

/** The exemplar controls of the Concepts box: the mode button, the list, the drawing.
 * `host`: say(text, level), render() (the whole page), enabled() (the server runs
 * concepts), image() (the open image: {width, height} or null). */
export class ExemplarPanel {
  constructor(host) {
    this.host = host;
    this.set = new ExemplarSet();
    this.drawing = false; // exemplar mode: drags draw exemplars, not box prompts
  }

  wire() {
    $("#exemplar-mode").addEventListener("click", () => this.toggle());
    $("#exemplar-clear").addEventListener("click", () => {
      this.set.clear();
      this.host.render();
    });
  }

  setLimits(ready) {
    this.set.setLimits(ready);
  }

  /** Exemplar mode on or off (`on` omitted: the other one). */
  toggle(on = !this.drawing) {
    const { say } = this.host;
    if (on && !this.host.enabled()) {
      return say("This server does not run concepts (serve --concepts): no exemplar boxes.");
    }
    this.drawing = Boolean(on);
    document.body.dataset.exemplar = this.drawing ? "on" : "off";
    say(
      this.drawing
        ? "Exemplar boxes: drag around an example of the concept; Shift+drag (or right-drag) " +
            "around something it is not. b or Esc: back to clicks."
        : "Exemplar boxes off: clicks and drags prompt objects again.",
    );
    this.host.render();
  }

  /** A drag that ended in exemplar mode (`drag`: {x0, y0, x1, y1, label, boxing}). */
  finish(drag) {
    const { say } = this.host;
    const image = this.host.image();
    if (!image) return say("Open an image first.");
    if (!drag.boxing) {
      return say("Exemplar mode: drag a box around an example (b turns the mode off).");
    }
    const positive = drag.label === 1;
    const refused = this.set.add(
      [drag.x0, drag.y0, drag.x1, drag.y1],
      positive,
      image.width,
      image.height,
    );
    if (refused) return say(refused, "error");
    const { count } = this.set;
    const limit = this.set.limits.boxes;
    say(
      `${positive ? "Positive" : "Negative"} exemplar added (${count}` +
        `${limit !== null ? ` of at most ${limit}` : ""}): Find sends it with the phrases.`,
    );
  }

  clear() {
    this.set.clear();
  }

  /** Draw the exemplars on the stage's prompt layer (after the prompts). */
  draw(stage, drag = null) {
    if (!stage.width) return;
    const context = stage.prompts.getContext("2d");
    drawExemplars(context, this.set.boxes, stage.scale, drag?.exemplar ? drag : null);
  }

  render() {
    const boxes = this.set.boxes;
    $("#exemplar-mode").setAttribute("aria-pressed", String(this.drawing));
    $("#exemplar-mode").classList.toggle("on", this.drawing);
    $("#exemplar-clear").hidden = !boxes.length;
    $("#exemplar-list").replaceChildren(...boxes.map((exemplar) => this.row(exemplar)));
  }

  row(exemplar) {
    const item = element("li", exemplar.positive ? "positive" : "negative");
    item.dataset.id = exemplar.id;
    const sign = element("span", "sign");
    sign.textContent = exemplar.positive ? "+" : "−";
    const where = element("span", "meta");
    const [x0, y0, x1, y1] = exemplar.box;
    where.textContent = `${exemplar.positive ? "example" : "not it"} · ${x0}, ${y0} → ${x1}, ${y1}`;
    const remove = button("✕", "remove this exemplar box", () => {
      this.set.remove(exemplar.id);
      this.host.render();
    });
    remove.classList.add("remove");
    item.append(sign, where, remove);
    return item;
  }
}
