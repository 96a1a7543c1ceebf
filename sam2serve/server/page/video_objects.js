// A video's objects as the page holds them (player.js): one made here with a click, or one
// the server made (a phrase's instance found by SAM 3, video_concepts.js), under the
// session's obj_id.
//
// An object: {id (the session's obj_id), name (null: unnamed), serverName (the name the
// session holds), onServer (the session tracks it), colour, visible, prompts: Map(frame ->
// {points: [{x, y, label}], box | null}), corrections: Set(frame), phrase (the search that
// found it, or null)}; its masks are the session's, per frame.

import { PALETTE } from "./objects.js";

/** A new object (`fields`: what it has from the start). */
export function objectOf(id, fields = {}) {
  return {
    id,
    name: null,
    serverName: null,
    onServer: false,
    colour: PALETTE[(((id - 1) % PALETTE.length) + PALETTE.length) % PALETTE.length],
    visible: true,
    prompts: new Map(),
    corrections: new Set(),
    phrase: null,
    ...fields,
  };
}

/** The objects of a search's frame (`found`: its {obj_id, name}s) that `video` (the
 * player: {objects, nextId, activeId}) does not list yet, added to it: the server chose
 * their ids and named them by the phrase. An object of the page's own under such an id
 * that the server does not know (made with n, never prompted: the server gave the id
 * away) moves to a free id. Returns the new ones. */
export function adopt(video, found, phrase) {
  const added = [];
  for (const { obj_id: id, name } of found) {
    const known = video.objects.find((object) => object.id === id);
    if (known?.onServer) continue;
    video.nextId = Math.max(video.nextId, id + 1);
    if (known) {
      known.id = video.nextId++;
      if (video.activeId === id) video.activeId = known.id;
    }
    const object = objectOf(id, { name: name ?? phrase, serverName: name ?? null, onServer: true, phrase });
    video.objects.push(object);
    added.push(object);
  }
  return added;
}
