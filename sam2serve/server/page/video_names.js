// The names of a video's objects (their class or label: their category in the export),
// kept by the server's session: the page checks a typed name by the server's rule
// (engine/user_text.py; the server has the last word on joiners) before it sends it, names an object with its first prompt
// (POST .../prompts' `name`) or renames it (PATCH /v1/videos/{id}/objects/{obj_id}), and
// draws each name beside its object's mask on the frame shown.

export const MAX_NAME_CHARS = 64;
// Control characters, line and paragraph separators, surrogates, private-use and
// unassigned code points, the invisible fillers and every format character (direction
// controls, zero-width space, BOM, tags) but the joiners U+200C/D: refused.
const REFUSED = /[\p{Cc}\p{Cs}\p{Co}\p{Cn}\p{Zl}\p{Zp}\u034F\u115F\u1160\u3164\uFFA0]|(?![\u200C\u200D])\p{Cf}/u;

/** A typed name checked: {name} (null: unnamed, for an empty field) or {error}. */
export function checkName(text) {
  const name = text.trim();
  if (!name) return { name: null };
  const length = [...name].length; // code points, as the server counts
  if (length > MAX_NAME_CHARS) {
    return { error: `the name has ${length} characters; at most ${MAX_NAME_CHARS}` };
  }
  if (REFUSED.test(name)) return { error: "the name holds a control or invisible character" };
  return { name };
}

/** What the page calls an object: its name, or "object N" while it has none. */
export function displayName(object) {
  return object.name ?? `object ${object.id}`;
}

/** Name (`name` null: unname) an object the session tracks; resolves to the session. */
export function renameObject(session, objId, name) {
  return session.whenFree(() =>
    session.api.call("PATCH", `/v1/videos/${encodeURIComponent(session.id)}/objects/${objId}`, {
      json: { name },
    }),
  );
}

/** The session's names (obj_id -> name) from its description (GET, PATCH, DELETE). */
export function namesOf(described) {
  return new Map((described.objects ?? []).map((object) => [object.obj_id, object.name]));
}

/** Each visible object's name above its mask's box on the stage's top canvas
 * (`labels`: {name, colour, bbox: [x, y, width, height]}). */
export function drawNames(stage, labels) {
  const context = stage.prompts.getContext("2d");
  const unit = stage.scale;
  const height = 14 * unit;
  context.font = `${Math.round(12 * unit)}px system-ui, sans-serif`;
  context.textBaseline = "bottom";
  for (const { name, colour, bbox } of labels) {
    const [x, y] = bbox;
    const top = Math.max(y, height);
    context.fillStyle = "#000000a0";
    context.fillRect(x, top - height, context.measureText(name).width + 6 * unit, height);
    context.fillStyle = colour;
    context.fillText(name, x + 3 * unit, top - unit);
  }
}
