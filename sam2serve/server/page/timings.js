// The page's own clock: every click's time from the pointer's release to its mask drawn on
// the canvas (HTTP round trip, JSON, decoding the runs and painting included), and the
// encodes and AMG runs. Kept in window.sam2serveTimings for tests and for the curious;
// window.sam2serveTimingStats(kind) gives their count, p50 and p90.

export const timings = [];

/** Record one measurement: `kind` ("click", "encode", "amg"), `ms`, and what the server
 * said it spent (`server_ms`, `queue_ms`). */
export function record(kind, ms, extra = {}) {
  const entry = { kind, ms: Math.round(ms * 10) / 10, ...extra, at: Date.now() };
  timings.push(entry);
  return entry;
}

/** The p-th percentile (0..100) of `values`, interpolated between ranks (numpy's default). */
export function percentile(values, p) {
  if (values.length === 0) return null;
  const sorted = [...values].sort((a, b) => a - b);
  const rank = (p / 100) * (sorted.length - 1);
  const low = Math.floor(rank);
  const high = Math.ceil(rank);
  return sorted[low] + (sorted[high] - sorted[low]) * (rank - low);
}

export function stats(kind = "click") {
  const values = timings.filter((entry) => entry.kind === kind).map((entry) => entry.ms);
  return { kind, n: values.length, p50: percentile(values, 50), p90: percentile(values, 90) };
}

window.sam2serveTimings = timings;
window.sam2serveTimingStats = stats;
