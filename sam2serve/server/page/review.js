// The review of AMG's masks ("Everything"): candidates the person accepts (each becomes an
// object), merges (their union becomes one object) or rejects.

import { contains, fromServer, union } from "./rle.js";

const CANDIDATE_COLOURS = ["#ffe119", "#00e5ff", "#ff4fd8", "#7cff4f", "#ff9f1c", "#b28dff"];

export class Review {
  /** `records`: /v1/amg's masks (segmentation as uncompressed RLE). */
  constructor(records) {
    this.candidates = records
      .map((record, index) => ({
        index,
        mask: fromServer(record.segmentation),
        area: record.area,
        score: record.predicted_iou,
        point: record.point_coords?.[0] ?? null,
        selected: false,
        colour: CANDIDATE_COLOURS[index % CANDIDATE_COLOURS.length],
      }))
      .sort((a, b) => b.area - a.area); // painted largest first: small masks stay visible
  }

  get empty() {
    return this.candidates.length === 0;
  }

  selected() {
    return this.candidates.filter((candidate) => candidate.selected);
  }

  /** The smallest candidate under image point (x, y), or null. */
  at(x, y) {
    for (let i = this.candidates.length - 1; i >= 0; i--) {
      if (contains(this.candidates[i].mask, x, y)) return this.candidates[i];
    }
    return null;
  }

  toggle(candidate) {
    candidate.selected = !candidate.selected;
  }

  selectAll(selected = true) {
    for (const candidate of this.candidates) candidate.selected = selected;
  }

  /** Take candidates out of the review (accepted, merged or rejected). */
  drop(candidates) {
    this.candidates = this.candidates.filter((candidate) => !candidates.includes(candidate));
  }

  /** The fields of the object a candidate becomes (its AMG click is its first point). */
  static objectOf(candidate) {
    return {
      mask: candidate.mask,
      score: candidate.score,
      points: candidate.point ? [{ x: candidate.point[0], y: candidate.point[1], label: 1 }] : [],
    };
  }

  /** The fields of the one object that merges `candidates`: their union, their clicks, no
   * score (no model predicted that mask). */
  static mergedOf(candidates) {
    return {
      mask: union(candidates.map((candidate) => candidate.mask)),
      score: null,
      points: candidates
        .filter((candidate) => candidate.point)
        .map((candidate) => ({ x: candidate.point[0], y: candidate.point[1], label: 1 })),
    };
  }
}
