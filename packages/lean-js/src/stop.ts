/**
 * Stop strings over streamed text. Text that could be the beginning of a stop string is held
 * back until the next token shows whether it is, so that no part of a stop string is ever
 * streamed out, even when it spans several tokens.
 */
export class StopMatcher {
  readonly #stops: readonly string[];
  #held = "";

  constructor(stops: readonly string[]) {
    for (const stop of stops) {
      if (typeof stop !== "string" || stop.length === 0) {
        throw new TypeError(`stop strings must be non-empty strings, got ${JSON.stringify(stop)}`);
      }
    }
    this.#stops = stops;
  }

  /**
   * Adds generated text. Returns the text that can be streamed now and, when a stop string
   * matched, that string (the text from it on is dropped; generation should end).
   */
  push(text: string): { text: string; stopped: string | null } {
    const buffer = this.#held + text;
    let first = -1;
    let stopped: string | null = null;
    for (const stop of this.#stops) {
      const at = buffer.indexOf(stop);
      if (at >= 0 && (first < 0 || at < first)) {
        first = at;
        stopped = stop;
      }
    }
    if (stopped !== null) {
      this.#held = "";
      return { text: buffer.slice(0, first), stopped };
    }
    const keep = this.#partialMatchLength(buffer);
    this.#held = buffer.slice(buffer.length - keep);
    return { text: buffer.slice(0, buffer.length - keep), stopped: null };
  }

  /** The text still held back, at the end of a generation that no stop string ended. */
  flush(): string {
    const held = this.#held;
    this.#held = "";
    return held;
  }

  /** Length of the longest suffix of `buffer` that is a proper prefix of a stop string. */
  #partialMatchLength(buffer: string): number {
    let longest = 0;
    for (const stop of this.#stops) {
      for (let n = Math.min(stop.length - 1, buffer.length); n > longest; n--) {
        if (buffer.endsWith(stop.slice(0, n))) {
          longest = n;
          break;
        }
      }
    }
    return longest;
  }
}
