// A video tracking session on the server (POST /v1/videos), as the page holds it: the
// frames it shows (GET /v1/videos/{id}/frames/{i}: the server's own decoding, so frame i
// of the masks is frame i of the picture; the last few kept as bitmaps), the masks it
// received per frame and object (rle.js runs, a few KB each), prompts, the streamed
// propagation, a phrase found and tracked through the clip (SAM 3's video predictor,
// streamed the same way), and the export of the masks (POST /v1/video-export, the server's writer),
// each object under its name (video_names.js: the session keeps the names).

import { ApiError } from "./api.js";
import { area, fromServer, toCoco } from "./rle.js";
import { serverEvents } from "./sse.js";
import { displayName } from "./video_names.js";

const KEPT_FRAMES = 64; // decoded frames kept for scrubbing back and forth
// A stopped propagation frees the session once its frame in flight is done: seconds on a
// CPU, so the page waits up to a minute before it says the session is busy.
const BUSY_WAIT_MS = 250;
const BUSY_TRIES = 240;

export class VideoSession {
  constructor(api, answer, name, frameNames = null) {
    this.api = api;
    this.id = answer.session_id;
    this.numFrames = answer.num_frames;
    this.width = answer.width;
    this.height = answer.height;
    this.fps = answer.fps;
    this.name = name;
    this.frameNames = frameNames;
    this.masks = Array.from({ length: this.numFrames }, () => new Map()); // obj_id -> mask
    // obj_id -> [x, y, width, height] of the mask (where the overlay writes its name)
    this.boxes = Array.from({ length: this.numFrames }, () => new Map());
    // The objects a propagation has tracked on each frame: a prompt there is a correction.
    this.tracked = Array.from({ length: this.numFrames }, () => new Set());
    this.bitmaps = new Map(); // frame -> Promise<ImageBitmap>, least recently used first
    this.closed = false;
  }

  /** Upload a video file (`video`: a Blob) or its frames (`frames`: image Blobs, in order). */
  static async create(api, { video, frames }, name, { onWait } = {}) {
    const form = new FormData();
    if (video) form.append("video", video, name);
    for (const frame of frames ?? []) form.append("frame", frame, frame.name);
    const answer = await api.retrying(() => api.call("POST", "/v1/videos", { form }), { onWait });
    const names = frames ? frames.map((frame) => frame.name) : null;
    return new VideoSession(api, answer, name, names);
  }

  /** Frame `index` as an ImageBitmap (fetched once, kept while recently used). */
  frame(index) {
    let bitmap = this.bitmaps.get(index);
    if (bitmap) {
      this.bitmaps.delete(index); // to the most recent end
    } else {
      bitmap = this.api
        .retrying(() => this.api.call("GET", `/v1/videos/${encodeURIComponent(this.id)}/frames/${index}`))
        .then((blob) => createImageBitmap(blob));
      bitmap.catch(() => this.bitmaps.delete(index)); // asked again next time
    }
    this.bitmaps.set(index, bitmap);
    while (this.bitmaps.size > KEPT_FRAMES) {
      const [oldest, kept] = this.bitmaps.entries().next().value;
      this.bitmaps.delete(oldest);
      kept.then((b) => b.close()).catch(() => {});
    }
    return bitmap;
  }

  /** The object's clicks and box on one frame (they replace its earlier ones there), and
   * its `name` when it has one the session does not know yet; the answer's masks of every
   * object on that frame are kept. */
  async prompt(frameIdx, objId, { points, box }, name = null) {
    const body = {
      frame_idx: frameIdx,
      obj_id: objId,
      points: points.map(({ x, y, label }) => ({ x, y, label })),
      clear_old_points: true,
      mask_format: "uncompressed_rle",
    };
    if (box) body.box = box;
    if (name) body.name = name;
    const answer = await this.whenFree(() =>
      this.api.call("POST", `/v1/videos/${encodeURIComponent(this.id)}/prompts`, { json: body }),
    );
    this.keep(answer);
    return answer;
  }

  /** Hand an object SAM 3's video predictor reported over to SAM 2.1 on frame `frameIdx`
   * (video_objects.js): the session forgets SAM 3's object (its masks here stay), and its
   * mask on the frame, when it has one there, becomes SAM 2.1's mask prompt for the same
   * id, with `name`. Resolves to that prompt's answer, or null (no mask on the frame: the
   * click that follows makes the object). */
  async handOver(frameIdx, objId, name) {
    await this.whenFree(() =>
      this.api.call("DELETE", `/v1/videos/${encodeURIComponent(this.id)}/objects/${objId}`),
    );
    const mask = this.masks[frameIdx].get(objId);
    if (!mask || area(mask) === 0) return null;
    const body = {
      frame_idx: frameIdx,
      obj_id: objId,
      mask: { size: [mask.h, mask.w], counts: Array.from(mask.counts) },
      mask_format: "uncompressed_rle",
    };
    if (name) body.name = name;
    const answer = await this.whenFree(() =>
      this.api.call("POST", `/v1/videos/${encodeURIComponent(this.id)}/prompts`, { json: body }),
    );
    this.keep(answer);
    return answer;
  }

  /** Track every object from `start` (forwards, or backwards with `reverse`), keeping
   * each frame's masks as it arrives and telling `onFrame(frameIdx, count, objects)`;
   * resolves to the server's summary. Aborting `signal` closes the stream: the server
   * stops the propagation at its next frame. */
  async propagate({ start, reverse, signal, onFrame }) {
    const json = { start_frame_idx: start, reverse, mask_format: "uncompressed_rle" };
    const response = await this.whenFree(() =>
      this.api.stream("POST", `/v1/videos/${encodeURIComponent(this.id)}/propagate`, { json, signal }),
    );
    return this.readFrames(response, "propagation", (frame) => this.keep(frame), onFrame);
  }

  /** Find every instance of the phrase `text` (or of each of `phrases`) from frame `start`
   * on and track it (SAM 3's video predictor on the server, one run per phrase: new
   * instances are picked up as they appear, lost ones ended), streamed and kept as
   * propagate() does. The server names each object by its phrase; a frame's answer holds
   * the phrases' objects (keep()). `maxFrames`,
   * `scoreThresh`: null for the server's. `onAccepted()`: the server took the request
   * (and forgot the objects an earlier search for the phrases reported). `clicks` (one
   * phrase; video_refine.js): the route's clicks on the phrase's objects, applied after
   * its pass; a frame then comes more than once, and its last answer replaces the
   * earlier ones (keep()). */
  async trackConcept(request) {
    const { text, phrases, start, maxFrames = null, scoreThresh = null, clicks = null, signal } = request;
    const { onAccepted, onFrame } = request;
    // one phrase as `text` (the route's first form), several as `phrases`
    const one = text ?? (phrases.length === 1 ? phrases[0] : null);
    const json = one !== null ? { text: one } : { phrases };
    Object.assign(json, { frame_idx: start, mask_format: "uncompressed_rle" });
    if (maxFrames !== null) json.max_frames = maxFrames;
    if (scoreThresh !== null) json.score_thresh = scoreThresh;
    if (clicks) json.clicks = clicks;
    const response = await this.whenFree(() =>
      this.api.stream("POST", `/v1/videos/${encodeURIComponent(this.id)}/concepts/track`, {
        json,
        signal,
      }),
    );
    onAccepted?.(); // the server has replaced the phrase's earlier objects
    const found = new Set(); // obj_ids this search has streamed so far
    return this.readFrames(response, "search", (frame) => this.keep(frame, found), onFrame);
  }

  /** A run's Server-Sent Events: each frame kept (`keep`) and told to `onFrame`, then the
   * `done` event's summary, or the `error` event's error thrown. */
  async readFrames(response, what, keep, onFrame) {
    let count = 0;
    for await (const { event, data } of serverEvents(response)) {
      if (event === "frame") {
        keep(data);
        for (const object of data.objects) this.tracked[data.frame_idx].add(object.obj_id);
        onFrame(data.frame_idx, ++count, data.objects);
      } else if (event === "done") {
        return data;
      } else if (event === "error") {
        throw new ApiError(500, data.error?.code ?? "error", data.error?.message ?? "failed");
      }
    }
    throw new ApiError(0, "network", `the ${what}'s stream ended before it was done`);
  }

  /** Stop tracking an object: its masks on every frame go. */
  async removeObject(objId) {
    const tracked = this.masks.some((frame) => frame.has(objId));
    if (tracked) {
      await this.whenFree(() =>
        this.api.call("DELETE", `/v1/videos/${encodeURIComponent(this.id)}/objects/${objId}`),
      ).catch((error) => {
        if (error.code !== "object_not_found") throw error; // never prompted: nothing to drop
      });
    }
    this.forget(objId);
  }

  /** Drop the object's masks here (the server has dropped it already). */
  forget(objId) {
    for (const frame of [...this.masks, ...this.boxes, ...this.tracked]) frame.delete(objId);
  }

  /** Close the session on the server (its memory is freed); the bitmaps go too. */
  close() {
    if (this.closed) return;
    this.closed = true;
    for (const bitmap of this.bitmaps.values()) bitmap.then((b) => b.close()).catch(() => {});
    this.bitmaps.clear();
    // keepalive: sent even when the tab is closing (the server frees the session now, not
    // after --video-idle).
    this.api
      .call("DELETE", `/v1/videos/${encodeURIComponent(this.id)}`, { keepalive: true })
      .catch(() => {});
  }

  /** One frame's answer kept: its objects' masks and boxes replace theirs; the frame's
   * other objects keep theirs (a propagation answers for the objects SAM 2.1 tracks, a
   * search for its phrase's). `owned` (a Set of obj_ids, grown here): the objects of a
   * search so far, whose masks the answer replaces all of: one it leaves out (ended, or
   * not seen there) has no mask on the frame. */
  keep(frameOut, owned = null) {
    const masks = new Map(this.masks[frameOut.frame_idx]);
    const boxes = new Map(this.boxes[frameOut.frame_idx]);
    for (const id of owned ?? []) {
      masks.delete(id);
      boxes.delete(id);
    }
    for (const object of frameOut.objects) {
      masks.set(object.obj_id, fromServer(object.segmentation));
      boxes.set(object.obj_id, object.bbox);
      owned?.add(object.obj_id);
    }
    this.masks[frameOut.frame_idx] = masks;
    this.boxes[frameOut.frame_idx] = boxes;
  }

  /** Frames where the object has a non-empty mask. */
  framesWith(objId) {
    let count = 0;
    for (const frame of this.masks) {
      const mask = frame.get(objId);
      if (mask && area(mask) > 0) count++;
    }
    return count;
  }

  /** POST /v1/video-export's body: every non-empty mask as COCO's compressed RLE. */
  exportBody(format, objects) {
    const frames = [];
    this.masks.forEach((masks, frameIdx) => {
      const present = objects
        .filter((object) => masks.has(object.id) && area(masks.get(object.id)) > 0)
        .map((object) => ({ obj_id: object.id, segmentation: toCoco(masks.get(object.id)) }));
      if (present.length) frames.push({ frame_idx: frameIdx, objects: present });
    });
    const video = { name: this.name, width: this.width, height: this.height, num_frames: this.numFrames };
    if (this.frameNames) video.frame_names = this.frameNames;
    if (this.fps) video.fps = this.fps;
    return {
      format,
      video,
      objects: objects.map((object) => ({ obj_id: object.id, name: displayName(object) })),
      frames,
    };
  }

  /** `attempt()` again while the session is busy (409): a propagation that was just
   * stopped ends at its next frame. */
  async whenFree(attempt) {
    for (let n = 1; ; n++) {
      try {
        return await this.api.retrying(attempt);
      } catch (error) {
        if (!(error instanceof ApiError) || error.code !== "session_busy" || n >= BUSY_TRIES) throw error;
        await new Promise((resolve) => setTimeout(resolve, BUSY_WAIT_MS));
      }
    }
  }
}
