// The objects of the image being labelled, and the history that undo walks back.
//
// An object: {id, name, colour, points: [{x, y, label}], box: [x0, y0, x1, y1] | null,
// mask (rle.js) | null, maskId (the server's id of the mask, the next click's mask
// input) | null, score | null, visible, epoch}. Masks and boxes are never mutated, only
// replaced, so a snapshot is a shallow copy. `epoch` changes with every change of the
// prompts: an answer to an older request (the person clicked again, or undid) is stale.

export const PALETTE = [
  "#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#42d4f4",
  "#f032e6", "#bfef45", "#fabed4", "#469990", "#dcbeff", "#9a6324",
  "#fffac8", "#800000", "#aaffc3", "#808000", "#ffd8b1", "#000075",
];
const HISTORY_LIMIT = 200;

let epochs = 0;

export class ObjectStore {
  constructor(onChange) {
    this.clear();
    this.onChange = onChange; // after clear(): the page renders once it has its store
  }

  clear() {
    this.objects = [];
    this.activeId = null;
    this.history = [];
    this.nextId = 1;
    this.onChange?.();
  }

  get(id) {
    return this.objects.find((object) => object.id === id) ?? null;
  }

  active() {
    return this.get(this.activeId);
  }

  activate(id) {
    this.activeId = this.get(id) ? id : null;
    this.onChange?.();
  }

  /** A new object (made active); one undo step removes it. */
  create(fields = {}, { record = true } = {}) {
    const id = this.nextId++;
    const object = {
      id,
      name: `object ${id}`,
      colour: PALETTE[(id - 1) % PALETTE.length],
      points: [],
      box: null,
      mask: null,
      maskId: null,
      score: null,
      visible: true,
      epoch: ++epochs,
      ...fields,
    };
    if (record) this.record([]);
    this.objects.push(object);
    this.history.at(-1)?.created.push(id);
    this.activeId = id;
    this.onChange?.();
    return object;
  }

  /** Start an undo step: the objects `ids` as they are now (before a change). */
  record(ids) {
    const before = ids.map((id) => {
      const index = this.objects.findIndex((object) => object.id === id);
      return { index, object: snapshot(this.objects[index]) };
    });
    this.history.push({ before, created: [], activeId: this.activeId });
    if (this.history.length > HISTORY_LIMIT) this.history.shift();
  }

  /** Add a prompt (a point, or a box that replaces the object's box) as one undo step. */
  prompt(id, { point = null, box = null }) {
    const object = this.get(id);
    this.record([id]);
    if (point) object.points = [...object.points, point];
    if (box) object.box = box;
    object.epoch = ++epochs;
    this.onChange?.();
    return object;
  }

  /** The answer to a request made at `epoch`: applied unless the prompts changed since. */
  answer(id, epoch, fields) {
    const object = this.get(id);
    if (!object || object.epoch !== epoch) return false;
    Object.assign(object, fields);
    this.onChange?.();
    return true;
  }

  /** Change fields that are not prompts (name, visibility): no undo step. */
  set(id, fields) {
    const object = this.get(id);
    if (object) Object.assign(object, fields);
    this.onChange?.();
  }

  remove(ids) {
    this.record(ids);
    this.objects = this.objects.filter((object) => !ids.includes(object.id));
    if (ids.includes(this.activeId)) this.activeId = this.objects.at(-1)?.id ?? null;
    this.onChange?.();
  }

  /** Undo the last step; false when there is none. */
  undo() {
    const step = this.history.pop();
    if (!step) return false;
    this.objects = this.objects.filter((object) => !step.created.includes(object.id));
    for (const { index, object } of step.before) {
      const at = this.objects.findIndex((o) => o.id === object.id);
      const restored = { ...object, epoch: ++epochs };
      if (at >= 0) this.objects[at] = restored;
      else this.objects.splice(Math.min(index, this.objects.length), 0, restored);
    }
    this.activeId = this.get(step.activeId) ? step.activeId : (this.objects.at(-1)?.id ?? null);
    this.onChange?.();
    return true;
  }
}

function snapshot(object) {
  return { ...object, points: [...object.points] };
}
