// A video's objects as the page holds them (player.js): one made here with a click, or one
// the server made (a phrase's instance found by SAM 3, video_concepts.js), under the
// session's obj_id.
//
// An object: {id (the session's obj_id), name (null: unnamed), serverName (the name the
// session holds), onServer (the session has it), tracker ("sam2.1": the session's prompts
// and propagations track it; "sam3": SAM 3's video predictor reported it, its masks are
// what the search streamed), colour, visible, prompts: Map(frame -> {points: [{x, y,
// label}], box | null}), corrections: Set(frame), phrase (the search that found it, or
// null)}; its masks are the session's, per frame.
//
// The server's SAM 2.1 does not prompt an object SAM 3 reported (409 concept_track_id), so
// the first click on one hands it over (player.js, VideoSession.handOver): the session
// forgets SAM 3's object and SAM 2.1 takes its mask on the clicked frame as a mask prompt,
// under the same id and name; from then on it is SAM 2.1's like any clicked object.

import { PALETTE } from "./objects.js";

/** A new object (`fields`: what it has from the start). */
export function objectOf(id, fields = {}) {
  return {
    id,
    name: null,
    serverName: null,
    onServer: false,
    tracker: "sam2.1",
    colour: PALETTE[(((id - 1) % PALETTE.length) + PALETTE.length) % PALETTE.length],
    visible: true,
    prompts: new Map(),
    corrections: new Set(),
    phrase: null,
    ...fields,
  };
}

/** The objects of a search's frame (`found`: its {obj_id, name, phrase}s) that `video` (the
 * player: {objects, nextId, activeId}) does not list yet, added to it: the server chose
 * their ids and named them by their phrase (`searched` where it does not say which). An object of the page's own under such an id
 * that the server does not know (made with n, never prompted: the server gave the id
 * away) moves to a free id. Returns the new ones. */
export function adopt(video, found, searched) {
  const added = [];
  for (const { obj_id: id, name, phrase: its } of found) {
    const phrase = its ?? searched; // the server says which phrase found it
    const known = video.objects.find((object) => object.id === id);
    if (known?.onServer) continue;
    video.nextId = Math.max(video.nextId, id + 1);
    if (known) {
      known.id = video.nextId++;
      if (video.activeId === id) video.activeId = known.id;
    }
    const object = objectOf(id, {
      name: name ?? phrase,
      serverName: name ?? null,
      onServer: true,
      tracker: "sam3",
      phrase,
    });
    video.objects.push(object);
    added.push(object);
  }
  return added;
}

/** The objects an earlier search for `phrase` reported that are still SAM 3's: a new
 * search for the same phrase replaces them on the server (their ids may come again). */
export function foundBefore(objects, phrase) {
  return objects.filter((object) => object.tracker === "sam3" && object.phrase === phrase);
}
