// "Refine with SAM 3" (video mode, after "Find in video"): clicks on an object SAM 3 found
// (left click on it, right click or Shift+click not on it, on the frame shown) are kept
// here per object and frame and drawn as dots; the refinement sends them all at once to
// POST /v1/videos/{id}/concepts/track as `clicks`, with the phrase, the first frame and
// the score threshold of the search that found the objects (the server runs that search
// again, applies the clicks, then Meta's partial pass: only the clicked objects tracked
// again). The route takes the clicks of one phrase; the page says so before sending.
//
// An object's clicks: object.refine, a Map(frame -> [{x, y, label}]) in the video's pixels.

import { quoted } from "./video_concepts.js";

// The route's bounds (video_schemas.py MAX_CONCEPT_CLICKS, MAX_CONCEPT_CLICK_POINTS).
export const MAX_CLICKS = 16; // objects and frames clicked in one refinement
export const MAX_POINTS = 16; // points of one object on one frame

/** The objects with clicks waiting for a refinement. */
export function clicked(objects) {
  return objects.filter((object) => object.tracker === "sam3" && object.refine?.size);
}

/** Add a click `point` ({x, y, label}) on `object` (SAM 3's) on `frame`; null, or why
 * not (the clicks of another phrase wait, a frame before the search's first `start`, or
 * the route's bounds). */
export function addClick(objects, object, frame, point, start = 0) {
  if (frame < start) {
    return `click on frame ${start} or later: the search for ${quoted([object.phrase])} started there`;
  }
  const others = clicked(objects).filter((other) => other.phrase !== object.phrase);
  if (others.length) {
    return (
      `refine one phrase at a time: clicks on ${quoted([others[0].phrase])} wait ` +
      `(g: refine them first)`
    );
  }
  const points = object.refine?.get(frame) ?? [];
  if (points.length >= MAX_POINTS) {
    return `at most ${MAX_POINTS} clicks on one object on one frame`;
  }
  const pairs = clicked(objects).reduce((sum, other) => sum + other.refine.size, 0);
  if (!points.length && pairs >= MAX_CLICKS) {
    return `at most ${MAX_CLICKS} objects and frames clicked in one refinement`;
  }
  object.refine ??= new Map();
  object.refine.set(frame, [...points, { x: point.x, y: point.y, label: point.label }]);
  return null;
}

/** The refinement's request for the clicks waiting, or {error}: {phrase, start, thresh,
 * clicks}, `searches` (Map phrase -> {start, thresh}) holding each phrase's last search.
 * The clicks are the route's: {frame_idx, obj_id, points: [[x, y]], labels}, by object
 * then frame. */
export function refinement(objects, searches) {
  const waiting = clicked(objects);
  if (!waiting.length) {
    return {
      error:
        "click an object SAM 3 found first (select it, then click on it; right click or " +
        "Shift+click: not on it)",
    };
  }
  const phrases = [...new Set(waiting.map((object) => object.phrase))];
  if (phrases.length > 1) {
    return { error: `refine one phrase at a time: clicks on objects of ${quoted(phrases)}` };
  }
  const [phrase] = phrases;
  const search = searches.get(phrase);
  if (!search) return { error: `find ${quoted([phrase])} again first` };
  const clicks = [];
  for (const object of waiting) {
    for (const [frame, points] of [...object.refine].sort(([a], [b]) => a - b)) {
      clicks.push({
        frame_idx: frame,
        obj_id: object.id,
        points: points.map(({ x, y }) => [x, y]),
        labels: points.map(({ label }) => label),
      });
    }
  }
  return { phrase, start: search.start, thresh: search.thresh, clicks };
}
