// "Find in video" (video mode, when the server runs SAM 3: its /readyz says concepts): one
// noun phrase or several, comma-separated ("person, dog"), found on every frame from the one
// shown to the last and tracked there by SAM 3's own video predictor on the server (POST
// /v1/videos/{id}/concepts/track, one run per phrase: new instances picked up as they
// appear, lost ones ended), streamed like a propagation (player.js runs both). Every
// instance becomes one of the video's objects, named by its phrase (its category in the
// export); clicks on it afterwards refine it with SAM 3 (video_refine.js: the button and
// g), or, with Alt or as a box, hand it to the session's SAM 2.1 video prompts like any
// object's.

import { checkName } from "./video_names.js";

const $ = (selector) => document.querySelector(selector);

/** The typed phrases checked: {phrases} or {error}. Comma-separated, trimmed, empty ones
 * and repeats dropped (as the image page's Concepts box); each by the rule of an object's
 * name (it becomes their name). */
export function checkPhrases(text) {
  const phrases = [];
  for (const part of text.split(",")) {
    if (!part.trim()) continue;
    const { name, error } = checkName(part);
    if (error) return { error: error.replace("the name", `the phrase "${part.trim()}"`) };
    if (!phrases.includes(name)) phrases.push(name);
  }
  if (!phrases.length) return { error: "type a phrase first (what to find: cat, red car)" };
  return { phrases };
}

/** Phrases in words: "cat" or "cat", "dog". */
export function quoted(phrases) {
  return phrases.map((phrase) => `"${phrase}"`).join(", ");
}

/** The score threshold field: null (empty: the server's default) or a number in 0..1, or
 * {error}. */
export function checkThreshold(text) {
  const value = text.trim();
  if (!value) return { thresh: null };
  const thresh = Number(value);
  if (!Number.isFinite(thresh) || thresh < 0 || thresh > 1) {
    return { error: `the score threshold is a number from 0 to 1, not ${value}` };
  }
  return { thresh };
}

/** The form: the phrase, the threshold and the button; `onFind(text, thresholdText)`;
 * Refine with SAM 3: `onRefine()`. */
export class FindInVideo {
  constructor(onFind, onRefine) {
    this.onFind = onFind;
    this.onRefine = onRefine;
    this.enabled = false;
  }

  wire() {
    $("#video-concept-form").addEventListener("submit", (event) => {
      event.preventDefault();
      if (document.activeElement?.closest("#video-concept-form")) document.activeElement.blur();
      this.onFind($("#video-concept-text").value, $("#video-concept-thresh").value);
    });
    $("#video-concept-refine").addEventListener("click", () => this.onRefine());
  }

  /** Shown only when the server runs the concept model. */
  enable(enabled) {
    this.enabled = Boolean(enabled);
    $("#video-concepts").hidden = !this.enabled;
  }

  /** Put the cursor in the phrase field (the `t` key); false without concepts. */
  focus() {
    if (!this.enabled) return false;
    $("#video-concept-text").focus();
    $("#video-concept-text").select();
    return true;
  }

  /** `idle`: a session is open and nothing runs on it; `clicked`: clicks wait for a
   * refinement. */
  render(idle, clicked = false) {
    $("#video-concept-find").disabled = !idle;
    $("#video-concept-refine").disabled = !idle || !clicked;
  }
}
