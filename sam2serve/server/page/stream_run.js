// One streamed job over a video session's frames, as the player runs it: a propagation
// (POST .../propagate) or a phrase found and tracked (POST .../concepts/track). Both are
// Server-Sent Events of frames that the page shows as they come; both are stopped the same
// way (aborting closes the stream, and the server stops at its next frame), and both show
// the same progress: frames received of those expected, frames per second, Esc to stop.
// The player holds at most one at a time (the session runs one job at a time).

export class StreamRun {
  /** `doing`: what the progress line says ("Propagating forwards"); `noun`: what a stop
   * says stopped ("Propagation"); `state`: the body's data-video while it runs;
   * `expected`: how many frames the server will stream. */
  constructor({ doing, noun, state, expected }) {
    this.controller = new AbortController();
    this.doing = doing;
    this.noun = noun;
    this.state = state;
    this.expected = expected;
    this.received = 0;
    this.detail = ""; // more for the progress line to say, after the rate
    this.started = performance.now();
  }

  get signal() {
    return this.controller.signal;
  }

  stop() {
    this.controller.abort();
  }

  /** The progress line while it runs. */
  progress() {
    const seconds = (performance.now() - this.started) / 1000;
    const rate = this.received && seconds > 0 ? ` · ${(this.received / seconds).toFixed(1)} frames/s` : "";
    return `${this.doing}: ${this.received} / ${this.expected} frames${rate}${this.detail} (Esc: stop)`;
  }

  /** The run in a sentence ("the propagation"). */
  the() {
    return `the ${this.noun[0].toLowerCase()}${this.noun.slice(1)}`;
  }

  /** What the page says once the person stopped it. */
  stopped() {
    return `${this.noun} stopped after ${this.received} of ${this.expected} frames.`;
  }
}

/** The server's summary of a run (its `done` event) in words: frames, seconds, rate. */
export function summary(done) {
  return (
    `${done.frames} frames in ${(done.elapsed_ms / 1000).toFixed(1)} s ` +
    `(${done.frames_per_s.toFixed(1)} frames/s)`
  );
}
