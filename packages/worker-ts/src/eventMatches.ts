// The match vocabulary of event waits (`ctx.waitForEvent(match, ...)`): which channel event
// completes a wait. The Python SDK's event_matches.py, with camelCase keys; the event side (the
// key each arriving event carries) is the SQL function awooop_event_key (migration 0171), and the
// scheduler's wait sweep compares the two (docs/worker-sdk.md "Event matches").
//
// | match                                        | completed by                                              |
// |----------------------------------------------|-----------------------------------------------------------|
// | "K" or { channel: "api", correlationKey: K } | an API event whose payload has "correlation_key": K       |
// | { channel: "telegram", chatId: C }           | a Telegram message in chat C (a reply in the same chat)   |
// | { channel: "alertmanager", groupKey: G }     | an Alertmanager notification of group G, status resolved  |
//
// A match goes to CreateWait as (channel, correlation key): the API key as it is, the chat id as
// its decimal text, the group key as the md5 hex of its text (a fixed length for a group key of any
// length; a digest for matching, not a secret).
import { createHash } from "node:crypto";
import { ChannelType } from "./gen/awooop/common/v1/common";

export type EventMatch =
  | string
  | { channel?: "api"; correlationKey: string }
  | { channel: "telegram"; chatId: number | string }
  | { channel: "alertmanager"; groupKey: string };

export type MatchChannel = "api" | "telegram" | "alertmanager";

const FIELDS: Readonly<Record<MatchChannel, string>> = {
  api: "correlationKey",
  telegram: "chatId",
  alertmanager: "groupKey",
};

export const MATCH_CHANNELS: Readonly<Record<MatchChannel, ChannelType>> = {
  api: ChannelType.CHANNEL_TYPE_API,
  telegram: ChannelType.CHANNEL_TYPE_TELEGRAM,
  alertmanager: ChannelType.CHANNEL_TYPE_ALERTMANAGER,
};

/** [channel, correlation key] of a match; a TypeError naming what is wrong with it. */
export function keyOf(match: EventMatch): [MatchChannel, string] {
  if (typeof match === "string") {
    if (!match) throw new TypeError("an api match's correlation key must be a non-empty string");
    return ["api", match];
  }
  if (match === null || typeof match !== "object" || Array.isArray(match)) {
    throw new TypeError(`a match is a correlation key or an object, not ${JSON.stringify(match)}`);
  }
  const given = match as Record<string, unknown>;
  const channel = (given.channel ?? "api") as MatchChannel;
  if (!Object.hasOwn(FIELDS, channel)) {
    const known = Object.keys(FIELDS).join(", ");
    throw new TypeError(`match channel must be one of ${known}, not ${JSON.stringify(channel)}`);
  }
  const field = FIELDS[channel];
  const extra = Object.keys(given).filter((k) => k !== "channel" && k !== field);
  if (extra.length > 0 || !(field in given)) {
    throw new TypeError(`a ${channel} match is { channel: "${channel}", ${field}: ... }, not ${JSON.stringify(given)}`);
  }
  const value = given[field];
  if (channel === "telegram") {
    if (typeof value === "number" && Number.isSafeInteger(value)) return [channel, String(value)];
    if (typeof value === "string" && /^-?\d+$/.test(value)) return [channel, BigInt(value).toString()];
    throw new TypeError(`telegram chatId must be an integer, not ${JSON.stringify(value)}`);
  }
  if (typeof value !== "string" || value === "") {
    throw new TypeError(`${channel} ${field} must be a non-empty string, not ${JSON.stringify(value)}`);
  }
  if (channel === "alertmanager") return [channel, createHash("md5").update(value, "utf8").digest("hex")];
  return [channel, value];
}
