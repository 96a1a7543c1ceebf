// The stage: three canvases of the image's own size, stacked and scaled together by CSS.
//   #image   the photo
//   #masks   the masks, one RGBA pixel per image pixel (transparent where there is none):
//            what a test reads back to see what was drawn
//   #prompts clicks, boxes and the box being dragged (on top, it takes the pointer)

import { paint } from "./rle.js";

const OBJECT_ALPHA = 0x80;
const CANDIDATE_ALPHA = 0x50;
const SELECTED_ALPHA = 0xc0;

/** An RGBA word (little-endian, as ImageData's bytes read as Uint32) of "#rrggbb". */
export function word(hex, alpha) {
  const value = Number.parseInt(hex.slice(1), 16);
  const r = (value >> 16) & 0xff;
  const g = (value >> 8) & 0xff;
  const b = value & 0xff;
  return ((alpha << 24) | (b << 16) | (g << 8) | r) >>> 0;
}

export class Stage {
  constructor(root) {
    this.root = root;
    this.image = root.querySelector("#image");
    this.masks = root.querySelector("#masks");
    this.prompts = root.querySelector("#prompts");
    this.width = 0;
    this.height = 0;
  }

  setImage(bitmap) {
    this.width = bitmap.width;
    this.height = bitmap.height;
    for (const canvas of [this.image, this.masks, this.prompts]) {
      canvas.width = this.width;
      canvas.height = this.height;
    }
    this.image.getContext("2d").drawImage(bitmap, 0, 0);
    this.maskLayer = new ImageData(this.width, this.height);
    this.maskWords = new Uint32Array(this.maskLayer.data.buffer);
    this.root.classList.add("loaded");
    this.fit();
  }

  /** The next picture of a video: drawn in place when it has the same size (the masks'
   * layer and the scale stay), else set up as a new image. */
  showFrame(bitmap) {
    if (bitmap.width !== this.width || bitmap.height !== this.height) return this.setImage(bitmap);
    this.image.getContext("2d").drawImage(bitmap, 0, 0);
  }

  /** Show the image as large as its container allows (small images are enlarged). */
  fit() {
    if (!this.width) return;
    const frame = this.root.parentElement;
    const room = { w: frame.clientWidth - 20, h: frame.clientHeight - 20 };
    const scale = Math.max(0.05, Math.min(room.w / this.width, room.h / this.height, 4));
    this.root.style.width = `${Math.floor(this.width * scale)}px`;
    this.root.style.height = `${Math.floor(this.height * scale)}px`;
  }

  /** Image coordinates of a pointer event on the top canvas, clamped to the image. */
  toImage(event) {
    const rect = this.prompts.getBoundingClientRect();
    const x = ((event.clientX - rect.left) / rect.width) * this.width;
    const y = ((event.clientY - rect.top) / rect.height) * this.height;
    return {
      x: Math.min(this.width, Math.max(0, x)),
      y: Math.min(this.height, Math.max(0, y)),
    };
  }

  /** Image pixels per CSS pixel (markers keep their size on screen). */
  get scale() {
    const shown = this.prompts.getBoundingClientRect().width;
    return shown > 0 ? this.width / shown : 1;
  }

  /** Paint every visible object's mask, then AMG's candidates under review (largest first,
   * so a small mask stays visible on a large one), in one pass. */
  renderMasks(objects, candidates = []) {
    if (!this.maskWords) return;
    this.maskWords.fill(0);
    for (const object of objects) {
      if (object.mask && object.visible) {
        paint(object.mask, this.maskWords, word(object.colour, OBJECT_ALPHA));
      }
    }
    for (const candidate of candidates) {
      const alpha = candidate.selected ? SELECTED_ALPHA : CANDIDATE_ALPHA;
      paint(candidate.mask, this.maskWords, word(candidate.colour, alpha));
    }
    this.masks.getContext("2d").putImageData(this.maskLayer, 0, 0);
  }

  /** Draw the clicks and boxes of the objects, the active one emphasised, and a box being
   * dragged (`drag`: {x0, y0, x1, y1} or null). */
  renderPrompts(objects, activeId, drag = null) {
    const context = this.prompts.getContext("2d");
    context.clearRect(0, 0, this.width, this.height);
    const unit = this.scale;
    for (const object of objects) {
      if (!object.visible) continue;
      const active = object.id === activeId;
      context.globalAlpha = active ? 1 : 0.6;
      if (object.box) {
        const [x0, y0, x1, y1] = object.box;
        context.lineWidth = 2 * unit;
        context.strokeStyle = object.colour;
        context.strokeRect(x0, y0, x1 - x0, y1 - y0);
      }
      for (const point of object.points) {
        this.marker(context, point, object.colour, (active ? 6 : 4) * unit);
      }
    }
    context.globalAlpha = 1;
    if (drag) {
      context.setLineDash([6 * unit, 4 * unit]);
      context.lineWidth = 2 * unit;
      context.strokeStyle = "#ffffff";
      context.strokeRect(drag.x0, drag.y0, drag.x1 - drag.x0, drag.y1 - drag.y0);
      context.setLineDash([]);
    }
  }

  /** Outline concept instances under review (`candidates`: {box, colour, phrase, score,
   * selected}): the current one solid, the others dashed, each labelled with its score. */
  renderInstances(candidates) {
    if (!candidates.length) return;
    const context = this.prompts.getContext("2d");
    const unit = this.scale;
    context.font = `${Math.round(12 * unit)}px system-ui, sans-serif`;
    context.textBaseline = "bottom";
    for (const instance of candidates) {
      if (!instance.box) continue; // an empty mask
      const [x0, y0, x1, y1] = instance.box;
      context.globalAlpha = instance.selected ? 1 : 0.7;
      context.setLineDash(instance.selected ? [] : [5 * unit, 3 * unit]);
      context.lineWidth = (instance.selected ? 3 : 1.5) * unit;
      context.strokeStyle = instance.colour;
      context.strokeRect(x0, y0, x1 - x0, y1 - y0);
      const label = `${instance.phrase} ${instance.score.toFixed(2)}`;
      const top = Math.max(y0, 14 * unit);
      context.fillStyle = "#000000a0";
      context.fillRect(x0, top - 14 * unit, context.measureText(label).width + 6 * unit, 14 * unit);
      context.fillStyle = instance.colour;
      context.fillText(label, x0 + 3 * unit, top - unit);
    }
    context.setLineDash([]);
    context.globalAlpha = 1;
  }

  marker(context, point, colour, radius) {
    context.beginPath();
    context.arc(point.x, point.y, radius, 0, 2 * Math.PI);
    context.fillStyle = point.label === 1 ? "#22c55e" : "#ef4444";
    context.fill();
    context.lineWidth = radius / 2.5;
    context.strokeStyle = colour;
    context.stroke();
    context.strokeStyle = "#ffffff";
    context.lineWidth = radius / 3;
    context.beginPath();
    context.moveTo(point.x - radius / 2, point.y);
    context.lineTo(point.x + radius / 2, point.y);
    if (point.label === 1) {
      context.moveTo(point.x, point.y - radius / 2);
      context.lineTo(point.x, point.y + radius / 2);
    }
    context.stroke();
  }
}
