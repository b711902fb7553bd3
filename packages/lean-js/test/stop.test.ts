import { describe, expect, it } from "vitest";
import { StopMatcher } from "../src/stop.js";

/** Feeds `pieces` one by one; returns what streams out and the stop that matched. */
function feed(stops: string[], pieces: string[]) {
  const matcher = new StopMatcher(stops);
  const out: string[] = [];
  for (const piece of pieces) {
    const { text, stopped } = matcher.push(piece);
    out.push(text);
    if (stopped !== null) return { out, stopped, rest: matcher.flush() };
  }
  return { out, stopped: null, rest: matcher.flush() };
}

describe("StopMatcher", () => {
  it("streams text unchanged when no stop string can start", () => {
    expect(feed(["###"], ["Hello", ", ", "world"])).toEqual({
      out: ["Hello", ", ", "world"],
      stopped: null,
      rest: "",
    });
  });

  it("holds back a possible start and cuts at a stop spanning tokens", () => {
    expect(feed(["\nUser:"], ["Sure.", "\n", "Us", "er: hi"])).toEqual({
      out: ["Sure.", "", "", ""],
      stopped: "\nUser:",
      rest: "",
    });
  });

  it("releases held text once it can no longer be a stop", () => {
    expect(feed(["\nUser:"], ["a\nU", "sb"])).toEqual({ out: ["a", "\nUsb"], stopped: null, rest: "" });
  });

  it("returns the text before the earliest of several stops", () => {
    expect(feed(["END", "STOP"], ["x STOP y END"]).out).toEqual(["x "]);
    expect(feed(["END", "STOP"], ["x STOP y END"]).stopped).toBe("STOP");
  });

  it("keeps the longest partial match when stops share prefixes", () => {
    // "aab": after "aa" both "a" and "aa" could start it; "aaab" still matches at offset 1.
    expect(feed(["aab"], ["x", "aa", "ab"])).toEqual({ out: ["x", "", "a"], stopped: "aab", rest: "" });
  });

  it("flushes held text at the end of a generation", () => {
    expect(feed(["</s>"], ["done <", "/"])).toEqual({ out: ["done ", ""], stopped: null, rest: "</" });
  });

  it("refuses empty stop strings", () => {
    expect(() => new StopMatcher([""])).toThrow(/non-empty strings/);
  });
});
