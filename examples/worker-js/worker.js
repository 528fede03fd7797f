#!/usr/bin/env node
// A rank worker for inferris-dist, written from docs/protocol.md (wire version 7) and
// docs/SPEC.md §3.7 alone: it shares no code with the project.
//
//   node worker.js --connect ADDRESS --rank R --world-size N [--keys DIR] [--join-timeout S]
//
// The run secret, when the scheduler started this worker, comes on standard input (protocol §3.2).
'use strict';

const crypto = require('crypto');
const fs = require('fs');
const path = require('path');
const tty = require('tty');
const zmq = require('zeromq');
const { Encoder, Decoder } = require('@msgpack/msgpack');

const VERSION = 7;
const TYPE = { HELLO: 1, CONFIG: 2, READY: 3, PLAN: 4, RESULT: 5, AUDIT: 6, SHARD: 7, STOP: 8, REFUSED: 9,
  FIRED: 10, RESIZE: 11 };
const TYPE_NAME = Object.fromEntries(Object.entries(TYPE).map(([k, v]) => [v, k]));

// Protocol §10: the bounds every frame is decoded within.
const MAX_FRAME = 64 * 1024 * 1024;
const MAX_HEADER = 256;
const MAX_STR = 65536;
const MAX_SMALL_BIN = 65536;
const MAX_ARRAY = 1 << 22;
const MAX_MAP = 1 << 20;
const MAX_DEPTH = 8;
const MAX_WORLD = 4096;
const MAX_STEP_NS = 10_000_000_000;
const MAX_TOKEN_NS = 10_000_000;
const TIMES_ASKED = 0x74;
const REMEMBERED_PLANS = 8;
// Protocol §11.3: what `garble` sends instead of a RESULT.
const GARBLE = Buffer.from('c1c1206e6f742061206d65737361676520c1', 'hex');

// Exit statuses, protocol §3.4.
const EXIT = { OK: 0, GONE: 1, USAGE: 2, PROTOCOL: 3 };

/** A message from the scheduler this worker must not act on (exit status 3). */
class ProtocolError extends Error {}

let who = 'worker-js';

/** Says why on standard error (the scheduler shows the last line as last words) and exits. */
function leave(status, why) {
  if (why) process.stderr.write(`${who}: ${why}\n`);
  process.exit(status);
}

function malformed(why) {
  throw new ProtocolError(why);
}

// ---------------------------------------------------------------------------------------------
// The command line (§3.1), the run secret (§3.2) and CURVE keys (§6.3).

function parseArgs(argv) {
  const opts = {};
  const known = new Set(['--connect', '--rank', '--world-size', '--keys', '--join-timeout']);
  for (let i = 0; i < argv.length; i++) {
    let name = argv[i];
    let value;
    const eq = name.indexOf('=');
    if (name.startsWith('--') && eq > 0) {
      value = name.slice(eq + 1);
      name = name.slice(0, eq);
    } else {
      value = argv[++i];
    }
    if (!known.has(name)) leave(EXIT.USAGE, `unknown argument ${JSON.stringify(name)}`);
    if (value === undefined) leave(EXIT.USAGE, `${name} needs a value`);
    opts[name.slice(2)] = value;
  }
  for (const need of ['connect', 'rank', 'world-size']) {
    if (opts[need] === undefined) leave(EXIT.USAGE, `--${need} is required`);
  }
  for (const name of ['rank', 'world-size']) {
    if (!/^[0-9]+$/.test(opts[name]) || opts[name].length > 9) {
      leave(EXIT.USAGE, `--${name} is ${JSON.stringify(opts[name])}, not an integer of the digits 0-9 alone`);
    }
  }
  const rank = Number(opts.rank);
  const worldSize = Number(opts['world-size']);
  if (worldSize < 1 || worldSize > MAX_WORLD) leave(EXIT.USAGE, `--world-size ${worldSize} is not in 1..${MAX_WORLD}`);
  if (rank >= worldSize) leave(EXIT.USAGE, `--rank ${rank} is outside 0..${worldSize - 1}`);
  const connect = opts.connect;
  if (!/^(ipc:\/\/.+|tcp:\/\/.+:[0-9]+)$/.test(connect)) {
    leave(EXIT.USAGE, `--connect ${JSON.stringify(connect)} is not ipc://PATH or tcp://HOST:PORT`);
  }
  let joinTimeout = null;
  if (opts['join-timeout'] !== undefined) {
    joinTimeout = Number(opts['join-timeout']);
    if (!/^[0-9]+(\.[0-9]+)?$/.test(opts['join-timeout']) || !(joinTimeout > 0)) {
      leave(EXIT.USAGE, `--join-timeout ${JSON.stringify(opts['join-timeout'])} is not a positive number of seconds`);
    }
  }
  return { connect, rank, worldSize, keys: opts.keys, joinTimeout };
}

/**
 * Sleeps the whole thread: before the event loop serves anything (reading the secret), and for the
 * last 2 ms at most of a wait (Worker.waitUntil). `ms` may be fractional.
 */
const nobodyWakes = new Int32Array(new SharedArrayBuffer(4));
function blockFor(ms) {
  Atomics.wait(nobodyWakes, 0, 0, ms);
}

/**
 * The run secret's bytes, or null for a worker someone else started: standard input that is a
 * terminal, closed, or at end of file before a single byte (§3.2).
 */
function readSecret() {
  if (tty.isatty(0)) return null;
  const chunks = [];
  let total = 0;
  const buf = Buffer.alloc(256);
  for (;;) {
    let got;
    try {
      got = fs.readSync(0, buf, 0, buf.length, null);
    } catch (err) {
      if (err.code === 'EAGAIN') {
        blockFor(10);
        continue;
      }
      if (err.code === 'EBADF' || err.code === 'EOF') break;
      throw err;
    }
    if (got === 0) break;
    chunks.push(Buffer.from(buf.subarray(0, got)));
    total += got;
    if (buf.subarray(0, got).includes(0x0a)) break;
    if (total > 4096) leave(EXIT.PROTOCOL, 'the run secret on standard input is longer than 4096 bytes');
  }
  if (total === 0) return null;
  const text = Buffer.concat(chunks).toString('latin1');
  const line = text.split('\n', 1)[0];
  if (line.length === 0 || line.length % 2 !== 0 || !/^[0-9a-fA-F]+$/.test(line)) {
    leave(EXIT.PROTOCOL, 'no run secret: the line on standard input is empty or not hexadecimal');
  }
  return Buffer.from(line, 'hex');
}

/** One key of a ZeroMQ certificate file (§6.3), as Z85 text. */
function readKey(file, which, secret) {
  let stat;
  try {
    stat = fs.statSync(file);
  } catch (err) {
    leave(EXIT.USAGE, `cannot read key file ${file}: ${err.code}`);
  }
  if (stat.size > 4096) leave(EXIT.USAGE, `key file ${file} is over 4096 bytes`);
  if (secret) {
    if (typeof process.getuid === 'function' && stat.uid !== process.getuid()) {
      leave(EXIT.USAGE, `secret key file ${file} is not yours`);
    }
    if ((stat.mode & 0o077) !== 0) leave(EXIT.USAGE, `secret key file ${file} can be read by others`);
  }
  for (const raw of fs.readFileSync(file, 'utf8').split('\n')) {
    const line = raw.replace(/^[ \t]+/, '');
    if (line.startsWith('#') || !line.startsWith(which) || !line.includes('=')) continue;
    const key = line.slice(line.indexOf('=') + 1).replace(/^[ \t'"]+|[ \t'"]+$/g, '');
    if (key.length !== 40) leave(EXIT.USAGE, `key file ${file}: ${which} is not 40 characters of Z85`);
    return key;
  }
  return leave(EXIT.USAGE, `key file ${file} holds no ${which}`);
}

// ---------------------------------------------------------------------------------------------
// Bounded msgpack (§5.1, §10).

/**
 * Walks one msgpack value over the whole frame without building it: refuses ext, the byte c1,
 * nesting deeper than MAX_DEPTH, any length past the frame's end or past §10's bounds, and bytes
 * after the value. Only then is the frame decoded, so no claimed length is ever allocated unchecked.
 */
function scan(buf) {
  const n = buf.length;
  let pos = 0;
  const open = [];
  const need = (k) => {
    if (k > n - pos) malformed('a length past the end of the frame');
  };
  const uint = (width) => {
    need(width);
    let v = 0;
    for (let i = 0; i < width; i++) v = v * 256 + buf[pos + i];
    pos += width;
    return v;
  };
  const skipStr = (len) => {
    if (len > MAX_STR) malformed(`a str of ${len} bytes, over ${MAX_STR}`);
    need(len);
    pos += len;
  };
  const skipBin = (len) => {
    need(len);
    pos += len;
  };
  for (;;) {
    need(1);
    const b = buf[pos++];
    let items = 0;
    if (b <= 0x7f || b >= 0xe0) {
      // fixint
    } else if (b <= 0x8f) {
      items = 2 * (b & 0x0f);
    } else if (b <= 0x9f) {
      items = b & 0x0f;
    } else if (b <= 0xbf) {
      skipStr(b & 0x1f);
    } else {
      switch (b) {
        case 0xc0: case 0xc2: case 0xc3: break;
        case 0xc4: skipBin(uint(1)); break;
        case 0xc5: skipBin(uint(2)); break;
        case 0xc6: skipBin(uint(4)); break;
        case 0xca: need(4); pos += 4; break;
        case 0xcb: need(8); pos += 8; break;
        case 0xcc: case 0xd0: need(1); pos += 1; break;
        case 0xcd: case 0xd1: need(2); pos += 2; break;
        case 0xce: case 0xd2: need(4); pos += 4; break;
        case 0xcf: case 0xd3: need(8); pos += 8; break;
        case 0xd9: skipStr(uint(1)); break;
        case 0xda: skipStr(uint(2)); break;
        case 0xdb: skipStr(uint(4)); break;
        case 0xdc: case 0xdd: {
          const len = uint(b === 0xdc ? 2 : 4);
          if (len > MAX_ARRAY) malformed(`an array of ${len} entries, over ${MAX_ARRAY}`);
          items = len;
          break;
        }
        case 0xde: case 0xdf: {
          const len = uint(b === 0xde ? 2 : 4);
          if (len > MAX_MAP) malformed(`a map of ${len} entries, over ${MAX_MAP}`);
          items = 2 * len;
          break;
        }
        case 0xc1: malformed('the byte c1, never valid msgpack'); break;
        default: malformed('an ext value, which no message holds');
      }
    }
    if (items > 0) {
      if (items > n - pos) malformed('a container longer than the rest of the frame');
      if (open.length + 1 > MAX_DEPTH) malformed(`nesting deeper than ${MAX_DEPTH}`);
      open.push(items);
      continue;
    }
    while (open.length > 0) {
      if (--open[open.length - 1] > 0) break;
      open.pop();
    }
    if (open.length === 0) break;
  }
  if (pos !== n) malformed(`${n - pos} bytes after the message`);
}

const refuseExt = {
  decode() {
    malformed('an ext value, which no message holds');
  },
  tryToEncode() {
    return null;
  },
};

const KEY_MARK = 'key:';
const utf8 = new TextDecoder('utf-8');
const decoder = new Decoder({
  maxStrLength: MAX_STR,
  maxBinLength: MAX_FRAME,
  maxArrayLength: MAX_ARRAY,
  maxMapLength: MAX_MAP,
  maxExtLength: 0,
  extensionCodec: refuseExt,
  useBigInt64: false,
  // Map keys (request ids) are decoded with a mark in front, so that any str is a key, `__proto__`
  // included (the library refuses that one as it stands); readScripts takes the mark off.
  keyDecoder: {
    canBeCached: () => true,
    decode: (bytes, offset, length) => KEY_MARK + utf8.decode(bytes.subarray(offset, offset + length)),
  },
  mapKeyConverter: (key) => (typeof key === 'string' && key.startsWith(KEY_MARK) ? key
    : malformed('a map key that is not a str')),
});
const encoder = new Encoder({ extensionCodec: refuseExt });
const floatEncoder = new Encoder({ extensionCodec: refuseExt, forceIntegerToFloat: true });

function decodeFrame(frame, limit, what) {
  if (frame.length > limit) malformed(`${what} of ${frame.length} bytes, over ${limit}`);
  scan(frame);
  try {
    return decoder.decode(frame);
  } catch (err) {
    if (err instanceof ProtocolError) throw err;
    return malformed(`${what} does not decode: ${err.message}`);
  }
}

const isInt = (v) => typeof v === 'number' && Number.isInteger(v);
const isBin = (v) => v instanceof Uint8Array;

function decodeHeader(frame) {
  const h = decodeFrame(frame, MAX_HEADER, 'a header');
  if (!Array.isArray(h) || h.length !== 6 || !h.every(isInt)) malformed('a header that is not six integers');
  if (h[0] !== VERSION) malformed(`protocol version ${h[0]}, want ${VERSION}`);
  if (!TYPE_NAME[h[1]]) malformed(`unknown message type ${h[1]}`);
  return { version: h[0], type: h[1], epoch: h[2], step: h[3], rank: h[4], worldSize: h[5] };
}

/** Little-endian int32 values of a bin, every one non-negative (§5.1 Columns). */
function int32s(bin, what) {
  if (bin.length % 4 !== 0) malformed(`${what} is not a whole number of int32s`);
  const view = new DataView(bin.buffer, bin.byteOffset, bin.byteLength);
  const out = new Int32Array(bin.length / 4);
  for (let i = 0; i < out.length; i++) {
    const v = view.getInt32(4 * i, true);
    if (v < 0) malformed(`${what} holds the negative value ${v}`);
    out[i] = v;
  }
  return out;
}

function packInt32s(columns) {
  const total = columns.reduce((sum, c) => sum + c.length, 0);
  const buf = Buffer.alloc(4 * total);
  let at = 0;
  for (const column of columns) {
    for (const v of column) {
      buf.writeInt32LE(v, at);
      at += 4;
    }
  }
  return buf;
}

// ---------------------------------------------------------------------------------------------
// The shard of pages (SPEC §2, protocol §7.4) and its wire layout (§5.7).

/** Page slots holding (request_id, position) pairs; pages come into being on their first write. */
class Shard {
  constructor(numPages, pageSize) {
    this.numPages = numPages;
    this.pageSize = pageSize;
    this.pages = new Map();
  }

  set(page, offset, requestId, position) {
    let slots = this.pages.get(page);
    if (!slots) {
      slots = new Map();
      this.pages.set(page, slots);
    }
    slots.set(offset, [requestId, position]);
  }

  /** Empties a slot if it still holds exactly this pair. */
  clearIf(page, offset, requestId, position) {
    const slots = this.pages.get(page);
    const held = slots && slots.get(offset);
    if (held && held[0] === requestId && held[1] === position) slots.delete(offset);
  }

  /** Writes positions start..start+count-1 of a request on its pages, in order (§7.4). */
  write(requestId, start, count, pages) {
    const ps = this.pageSize;
    const firstLogical = Math.floor(start / ps);
    for (let p = start; p < start + count; p++) {
      const j = Math.floor(p / ps) - firstLogical;
      if (j >= pages.length) break;
      this.set(pages[j], p % ps, requestId, p);
    }
  }

  /** Sets every slot a SHARD-layout value names (CONFIG's or RESIZE's `shard`, §6.5, §8.5). */
  load(entries, what) {
    if (!Array.isArray(entries)) malformed(`${what}'s shard is not an array`);
    for (const entry of entries) {
      if (!Array.isArray(entry) || entry.length !== 2 || !isInt(entry[0]) || !Array.isArray(entry[1])) {
        malformed(`${what}'s shard has an entry that is not [page, layers]`);
      }
      const [page, layers] = entry;
      if (page < 0 || page >= this.numPages) malformed(`${what}'s shard names page ${page}, outside the pages`);
      for (const layer of layers) {
        if (!Array.isArray(layer) || layer.length !== 3 || typeof layer[0] !== 'string' || !isInt(layer[1])
            || !isBin(layer[2])) {
          malformed(`${what}'s shard has a layer that is not [request_id, base, mask]`);
        }
        const [requestId, base, mask] = layer;
        if (mask.length > MAX_SMALL_BIN) malformed(`a mask in ${what}'s shard is over 65536 bytes`);
        for (let byte = 0; byte < mask.length; byte++) {
          for (let bit = 0; bit < 8; bit++) {
            if (!(mask[byte] & (1 << bit))) continue;
            const offset = 8 * byte + bit;
            if (offset >= this.pageSize) malformed(`a mask in ${what}'s shard sets slot ${offset}, past the page`);
            this.set(page, offset, requestId, base + offset);
          }
        }
      }
    }
  }

  /** The shard in the SHARD layout: pages ascending, a layer per (writer, base). */
  toWire() {
    const out = [];
    for (const page of [...this.pages.keys()].sort((a, b) => a - b)) {
      const layers = new Map();
      for (const [offset, [requestId, position]] of this.pages.get(page)) {
        const base = position - offset;
        const key = `${base}\u0000${requestId}`;
        let layer = layers.get(key);
        if (!layer) {
          layer = { requestId, base, bits: [] };
          layers.set(key, layer);
        }
        layer.bits.push(offset);
      }
      if (layers.size === 0) continue;
      const wire = [];
      for (const { requestId, base, bits } of layers.values()) {
        const mask = Buffer.alloc(Math.floor(Math.max(...bits) / 8) + 1);
        for (const k of bits) mask[k >> 3] |= 1 << (k & 7);
        wire.push([requestId, base, mask]);
      }
      out.push([page, wire]);
    }
    return out;
  }
}

// ---------------------------------------------------------------------------------------------
// CONFIG (§5.3) and the faults profile's texts (§11.1).

const FAULT_WHEN = {
  crash: 'before', exit: 'before', hang: 'before', delay: 'before',
  slow: 'time', jitter: 'time',
  disagree: 'outcome', 'bad-writes': 'outcome',
  garble: 'send', duplicate: 'send', stale: 'send',
  'crash-after-reply': 'after-reply',
  'drop-write': 'after-writes',
};

// §11.1: the kinds that take ARG, and its range; every other kind takes none.
const FAULT_ARG = {
  delay: { min: 0, max: 3600, what: 'seconds' },
  jitter: { min: 0, max: 3600, what: 'seconds' },
  slow: { min: 1, max: 100, what: 'a factor' },
};

function parseFault(text) {
  const m = /^(all|[0-9]+):([a-z-]+)@([0-9]+)(\+)?(?::([0-9]+(?:\.[0-9]+)?))?$/.exec(text);
  if (!m) malformed(`fault ${JSON.stringify(text)} is not RANK:KIND@STEP[+][:ARG]`);
  const kind = m[2];
  if (!Object.hasOwn(FAULT_WHEN, kind)) malformed(`fault ${JSON.stringify(text)}: this worker cannot act out ${kind}`);
  const arg = m[5] === undefined ? null : Number(m[5]);
  const rule = Object.hasOwn(FAULT_ARG, kind) ? FAULT_ARG[kind] : null;
  if (rule === null && arg !== null) malformed(`fault ${JSON.stringify(text)}: ${kind} takes no argument`);
  if (rule !== null && (arg === null || !Number.isFinite(arg) || arg < rule.min || arg > rule.max)) {
    malformed(`fault ${JSON.stringify(text)}: ${kind} takes ${rule.what}, ${rule.min} to ${rule.max}`);
  }
  return { text, kind, step: Number(m[3]), repeat: m[4] === '+', arg: arg ?? 0, spent: false };
}

/**
 * `jitter`'s lengthening of the model's time at a step (§11.3): a draw from 0 to ARG seconds,
 * deterministic in the fault's text and the step (SHA-256 of both, its first 53 bits as a fraction),
 * so that the same run asks for the same times.
 */
function jitterSeconds(fault, step) {
  const digest = crypto.createHash('sha256').update(`${fault.text}\u0000${step}`, 'utf8').digest();
  const fraction = Number(digest.readBigUInt64BE(0) >> 11n) / 2 ** 53;
  return fraction * fault.arg;
}

function parseConfig(body) {
  if (!Array.isArray(body) || body.length !== 6) malformed('CONFIG is not an array of 6');
  const [numPages, pageSize, scripts, shard, faults, cost] = body;
  if (!isInt(numPages) || numPages < 1 || !isInt(pageSize) || pageSize < 1) {
    malformed('CONFIG geometry is not two integers >= 1');
  }
  if (scripts === null || typeof scripts !== 'object' || Array.isArray(scripts) || isBin(scripts)) {
    malformed("CONFIG's accept_scripts is not a map");
  }
  const byRequest = new Map();
  for (const [key, entries] of Object.entries(scripts)) {
    if (!Array.isArray(entries) || !entries.every(isInt)) malformed('an accept script is not an array of integers');
    byRequest.set(key.slice(KEY_MARK.length), entries);
  }
  const parsedFaults = parseFaults(faults, 'CONFIG');
  if (!Array.isArray(cost) || cost.length !== 2 || !cost.every(isInt) || cost[0] < 0 || cost[0] > MAX_STEP_NS
      || cost[1] < 0 || cost[1] > MAX_TOKEN_NS) {
    malformed("CONFIG's exec_cost is not [per_step_ns, per_token_ns] in range");
  }
  const pages = new Shard(numPages, pageSize);
  pages.load(shard, 'CONFIG');
  return { scripts: byRequest, shard: pages, faults: parsedFaults, perStepNs: cost[0], perTokenNs: cost[1] };
}

/** CONFIG's or RESIZE's `faults` (§5.3, §5.10): strings, each a fault this worker can act out. */
function parseFaults(faults, what) {
  if (!Array.isArray(faults) || !faults.every((f) => typeof f === 'string')) malformed(`${what}'s faults are not strings`);
  return faults.map(parseFault);
}

/**
 * RESIZE (§5.10): `[shard, faults]`, read against the geometry CONFIG gave (a RESIZE carries none).
 * The new shard starts empty and takes every slot `shard` names, as CONFIG's does (§8.5 step 2).
 */
function parseResize(body, numPages, pageSize) {
  if (!Array.isArray(body) || body.length !== 2) malformed('RESIZE is not an array of 2');
  const [shard, faults] = body;
  const pages = new Shard(numPages, pageSize);
  pages.load(shard, 'RESIZE');
  return { shard: pages, faults: parseFaults(faults, 'RESIZE') };
}

// ---------------------------------------------------------------------------------------------
// PLAN (§5.5, §7.1) and what a rank computes from it (SPEC §3.7, protocol §7.2-§7.6).

function parsePlan(body, numPages) {
  if (!Array.isArray(body) || body.length !== 4) malformed('PLAN is not an array of 4');
  const [step, ids, columns, pagesBin] = body;
  if (!isInt(step) || !Array.isArray(ids) || !ids.every((id) => typeof id === 'string') || !isBin(columns)
      || !isBin(pagesBin)) {
    malformed('PLAN is not [int, array of str, bin, bin]');
  }
  const n = ids.length;
  if (columns.length !== 28 * n) malformed(`PLAN columns are ${columns.length} bytes for ${n} items, not ${28 * n}`);
  const cols = int32s(columns, 'PLAN columns');
  const pages = int32s(pagesBin, 'PLAN pages');
  const col = (j) => cols.subarray(n * j, n * (j + 1));
  const plan = {
    step, ids, n, columns, pagesBin, pages,
    start: col(0), numTokens: col(1), draftLen: col(2), decode: col(3), verdictIndex: col(4), numPages: col(5),
    priorDrafts: col(6), itemPages: [], anyPrior: false,
  };
  let at = 0;
  for (let i = 0; i < n; i++) {
    if (plan.numTokens[i] < 1) malformed(`PLAN item ${i} has num_tokens ${plan.numTokens[i]}`);
    if (plan.decode[i] > 1) malformed(`PLAN item ${i} has decode ${plan.decode[i]}`);
    if (plan.priorDrafts[i] > 0) {
      plan.anyPrior = true;
      if (plan.decode[i] !== 1 || plan.verdictIndex[i] < 1 || plan.priorDrafts[i] > plan.start[i]) {
        malformed(`PLAN item ${i} has prior_drafts but is not a decode item that can follow one`);
      }
    }
    if (plan.numPages[i] > pages.length - at) malformed("PLAN num_pages sum past the pages' end");
    plan.itemPages.push(pages.subarray(at, at + plan.numPages[i]));
    at += plan.numPages[i];
  }
  if (at !== pages.length) malformed(`PLAN names ${pages.length} pages, its items ${at}`);
  for (const page of pages) if (page >= numPages) malformed(`PLAN names page ${page}, outside 0..${numPages - 1}`);
  return plan;
}

/** SPEC §3.7: the accepted drafts of a decode item that drafted `drafted`. */
function verdict(scripts, requestId, verdictIndex, drafted) {
  const script = scripts.get(requestId);
  if (!script || verdictIndex >= script.length) return drafted;
  const a = script[verdictIndex];
  return a < 0 ? 0 : a > drafted ? drafted : a;
}

/** Every item's outcome: where it really runs (§7.5) and its verdict (§7.2). */
function outcomes(plan, scripts, pageSize) {
  const out = [];
  for (let i = 0; i < plan.n; i++) {
    const rid = plan.ids[i];
    const n = plan.numTokens[i];
    let start = plan.start[i];
    let pages = plan.itemPages[i];
    const d = plan.priorDrafts[i];
    if (d > 0) {
      const a = verdict(scripts, rid, plan.verdictIndex[i] - 1, d);
      const first = Math.floor((start - d) / pageSize);
      start -= d - a;
      pages = pages.subarray(Math.floor(start / pageSize) - first, Math.floor((start + n - 1) / pageSize) - first + 1);
    }
    const accepted = plan.decode[i] === 1 ? verdict(scripts, rid, plan.verdictIndex[i], n - 1) : 0;
    out.push({ rid, start, n, accepted, pages });
  }
  return out;
}

function resultBody(plan, items) {
  const n = items.length;
  const columns = packInt32s([items.map((o) => o.start), items.map((o) => o.n), items.map((o) => o.accepted),
    items.map((o) => o.pages.length)]);
  const writes = packInt32s(items.map((o) => o.pages));
  return encoder.encode([plan.ids, columns.subarray(0, 16 * n), writes]);
}

// ---------------------------------------------------------------------------------------------
// The worker.

const now = () => Number(process.hrtime.bigint()) / 1e9;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

class Worker {
  constructor(args, secret) {
    this.args = args;
    this.secret = secret;
    this.spawned = secret !== null;
    // The rank and world size every header carries: those of the command line until a RESIZE or a CONFIG
    // again (§4, §8.5, §8.6).
    this.rank = args.rank;
    this.worldSize = args.worldSize;
    this.config = null;
    this.answered = [];
    this.lastResult = null;
    this.hanging = false;
    this.sock = new zmq.Dealer();
    const s = this.sock;
    s.linger = 0;
    s.maxMessageSize = MAX_FRAME;
    s.sendTimeout = 5000;
    s.reconnectInterval = 2;
    if (args.connect.startsWith('tcp://')) {
      s.heartbeatInterval = 1000;
      s.heartbeatTimeout = 3000;
    }
    if (args.connect.startsWith('tcp://[')) s.ipv6 = true;
    if (args.keys) {
      s.curveServerKey = readKey(path.join(args.keys, 'scheduler.key'), 'public-key', false);
      const own = path.join(args.keys, `rank-${args.rank}.key_secret`);
      s.curvePublicKey = readKey(own, 'public-key', true);
      s.curveSecretKey = readKey(own, 'secret-key', true);
    }
  }

  header(type, epoch, step) {
    return encoder.encode([VERSION, type, epoch, step, this.rank, this.worldSize]);
  }

  async send(frames) {
    try {
      await this.sock.send(frames);
    } catch (err) {
      leave(EXIT.GONE, `cannot send to the scheduler: ${err.message}`);
    }
  }

  /** Exits when the connection, once made, closes or fails its handshake (§3.5, §6.3). */
  watch() {
    const events = this.sock.events;
    events.on('disconnect', () => {
      // A STOP or REFUSED already received is acted on first (§3.5): give the loop a moment.
      setTimeout(() => leave(EXIT.GONE, 'the connection to the scheduler closed'), 200);
    });
    for (const kind of ['handshake:error:protocol', 'handshake:error:auth', 'handshake:error:other']) {
      events.on(kind, (event) => leave(EXIT.GONE, `handshake failed: ${kind.split(':')[2]}: ${event.error?.message || ''}`));
    }
    if (this.spawned) {
      const parent = process.ppid;
      setInterval(() => {
        if (process.ppid !== parent) leave(EXIT.OK, 'the scheduler that started this worker is gone');
      }, 250).unref();
    }
  }

  /** Receives one message as [header, body frame, timesAsked]; checks its frames (§2.4). */
  async receive(timeoutMs) {
    this.sock.receiveTimeout = timeoutMs;
    let frames;
    try {
      frames = await this.sock.receive();
    } catch (err) {
      if (err.code === 'EAGAIN') return null;
      return leave(EXIT.GONE, `cannot receive from the scheduler: ${err.message}`);
    }
    const received = now();
    if (frames.length !== 2 && frames.length !== 3) malformed(`a message of ${frames.length} frames`);
    for (const f of frames) if (f.length > MAX_FRAME) malformed(`a frame of ${f.length} bytes`);
    const header = decodeHeader(frames[0]);
    const timesAsked = frames.length === 3;
    if (timesAsked && (header.type !== TYPE.PLAN || frames[2].length !== 1 || frames[2][0] !== TIMES_ASKED)) {
      malformed('a third frame that is not a PLAN asking for times');
    }
    return { header, body: frames[1], timesAsked, received };
  }

  async run() {
    this.watch();
    this.sock.connect(this.args.connect);
    const hello = encoder.encode([process.pid, this.proof()]);
    const helloHeader = this.header(TYPE.HELLO, 0, 0);
    const waitS = this.args.joinTimeout ?? (this.spawned ? 30 : 60);
    const deadline = Date.now() + waitS * 1000;
    let msg = null;
    await this.send([helloHeader, hello]);
    while (msg === null) {
      const left = deadline - Date.now();
      if (left <= 0) leave(EXIT.GONE, `no CONFIG within ${waitS} s`);
      msg = await this.receive(this.spawned ? left : Math.min(left, 1000));
      if (msg === null && !this.spawned && Date.now() < deadline) await this.send([helloHeader, hello]);
    }
    if (msg.header.type === TYPE.REFUSED) this.refused(msg);
    // The first message is CONFIG or REFUSED; anything else, a RESIZE included, is unexpected (§6.1).
    if (msg.header.type !== TYPE.CONFIG) malformed(`${TYPE_NAME[msg.header.type]} before CONFIG`);
    if (msg.header.rank !== this.args.rank || msg.header.worldSize !== this.args.worldSize) {
      malformed(`a CONFIG for rank ${msg.header.rank} of ${msg.header.worldSize}, not rank ${this.args.rank} `
                + `of ${this.args.worldSize} (§6.5)`);
    }
    await this.configure(msg);
    for (;;) {
      msg = await this.receive(-1);
      await this.serve(msg);
    }
  }

  proof() {
    if (!this.secret) return new Uint8Array(0);
    const text = `inferris-dist hello v${VERSION} rank=${this.args.rank} world=${this.args.worldSize} pid=${process.pid}`;
    return crypto.createHmac('sha256', this.secret).update(text, 'ascii').digest();
  }

  refused(msg) {
    const body = decodeFrame(msg.body, MAX_FRAME, 'REFUSED');
    if (!Array.isArray(body) || body.length !== 1 || typeof body[0] !== 'string') malformed('REFUSED is not [reason]');
    leave(EXIT.GONE, 'refused by the scheduler');
  }

  emptyBody(msg) {
    if (msg.body.length !== 1 || msg.body[0] !== 0x90) malformed(`${TYPE_NAME[msg.header.type]} whose body is not []`);
  }

  async serve(msg) {
    const { type } = msg.header;
    if (type === TYPE.REFUSED) this.refused(msg);
    if (type === TYPE.STOP) {
      this.emptyBody(msg);
      leave(EXIT.OK, null);
    }
    if (type !== TYPE.PLAN && type !== TYPE.AUDIT && type !== TYPE.RESIZE && type !== TYPE.CONFIG) {
      malformed(`unexpected ${TYPE_NAME[type]} after READY`);
    }
    if (this.hanging) {
      // A hang answers nothing; it still reads, so that STOP and REFUSED end it.
      return;
    }
    if (type === TYPE.RESIZE) {
      await this.resize(msg);
      return;
    }
    if (type === TYPE.CONFIG) {
      await this.again(msg);
      return;
    }
    if (type === TYPE.AUDIT) {
      this.emptyBody(msg);
      const shard = encoder.encode(this.config.shard.toWire());
      await this.send([this.header(TYPE.SHARD, msg.header.epoch, msg.header.step), shard]);
      return;
    }
    await this.step(msg);
  }

  /**
   * CONFIG (§6.5): the header's rank, world size and epoch become this member's own, the shard is made
   * afresh from `shard`, the accept scripts, faults and exec_cost are taken, and everything of a run
   * before is forgotten: the spent faults with their texts, the `(epoch, step)` of the plans answered
   * (§8.2), the RESULT `stale` would send again; then READY. At the handshake the header names the rank
   * and world size of the command line (run checks it); a CONFIG again may name others (§8.6).
   */
  async configure(msg) {
    const { epoch, rank, worldSize } = msg.header;
    const config = parseConfig(decodeFrame(msg.body, MAX_FRAME, 'CONFIG'));
    this.rank = rank;
    this.worldSize = worldSize;
    who = `worker-js rank ${rank}`;
    this.config = config;
    this.answered = [];
    this.lastResult = null;
    await this.send([this.header(TYPE.READY, epoch, 0), encoder.encode([])]);
  }

  /**
   * CONFIG again (§8.6): a new run on the same connection and process, no HELLO. Its epoch is the new
   * run's first and may be lower than this member's own. Any number may come.
   */
  async again(msg) {
    const { rank, worldSize } = msg.header;
    // The rank must be one a header can name (§4, §10: a world of 1 to 4096).
    if (worldSize < 1 || worldSize > MAX_WORLD || rank < 0 || rank >= worldSize) {
      malformed(`a CONFIG again for rank ${rank} of a world of ${worldSize}`);
    }
    await this.configure(msg);
  }

  /**
   * RESIZE (§8.5): the header's rank, world size and epoch become this member's own, the shard and
   * the faults are replaced whole, the accept scripts and exec_cost stay; then READY under the new rank.
   * Any number may come.
   */
  async resize(msg) {
    const { epoch, rank, worldSize } = msg.header;
    // The new rank must be one a header can name (§4, §10: a world of 1 to 4096).
    if (worldSize < 1 || worldSize > MAX_WORLD || rank < 0 || rank >= worldSize) {
      malformed(`a RESIZE to rank ${rank} of a world of ${worldSize}`);
    }
    const cfg = this.config;
    const { shard, faults } = parseResize(decodeFrame(msg.body, MAX_FRAME, 'RESIZE'), cfg.shard.numPages,
      cfg.shard.pageSize);
    this.rank = rank;
    this.worldSize = worldSize;
    who = `worker-js rank ${rank}`;
    cfg.shard = shard;
    cfg.faults = faults;
    await this.send([this.header(TYPE.READY, epoch, 0), encoder.encode([])]);
  }

  /** A PLAN: checked whole, then faults, verdicts, the model's time, the RESULT, the writes (§7.1). */
  async step(msg) {
    const { epoch, step: headerStep } = msg.header;
    const cfg = this.config;
    const plan = parsePlan(decodeFrame(msg.body, MAX_FRAME, 'PLAN'), cfg.shard.numPages);
    const decoded = now();
    if (this.answered.some(([e, s]) => e === epoch && s === headerStep)) return;
    this.answered.push([epoch, headerStep]);
    if (this.answered.length > REMEMBERED_PLANS) this.answered.shift();

    const acting = await this.fire(plan, epoch, headerStep);
    // Several kinds acting before the step: the first of crash, exit, hang, delay wins (§11.3).
    if (acting.crash) await this.die('crash');
    if (acting.exit) await this.die('exit');
    if (acting.hang) {
      this.hanging = true;
      process.stderr.write(`${who}: hangs at step ${plan.step} (fault ${acting.hang.text})\n`);
      if (this.spawned) {
        // Only the scheduler's going away ends a spawned worker's hang (§11.3, §3.5).
        this.sock.receiveTimeout = -1;
        await new Promise(() => {});
      }
      return;
    }
    if (acting.delay) await this.waitUntil(now() + acting.delay.arg);

    const items = outcomes(plan, cfg.scripts, cfg.shard.pageSize);
    // The model's time (§7.8), stretched by `slow` and lengthened by `jitter` (§11.3): time only,
    // never what the RESULT says.
    const tokens = items.reduce((sum, o) => sum + o.n, 0);
    let modelS = (cfg.perStepNs + cfg.perTokenNs * tokens) / 1e9;
    if (acting.slow) modelS *= acting.slow.arg;
    if (acting.jitter) modelS += jitterSeconds(acting.jitter, plan.step);
    if (modelS > 0) await this.waitUntil(msg.received + modelS);
    const executed = now();

    let body;
    if (acting.disagree || acting['bad-writes']) {
      const reported = items.map((o) => ({ ...o }));
      if (acting.disagree && reported.length > 0) reported[0].accepted += 1;
      if (acting['bad-writes'] && reported.length > 0 && reported[0].pages.length > 0) {
        const pages = Int32Array.from(reported[0].pages);
        pages[0] = (pages[0] + 1) % cfg.shard.numPages;
        reported[0].pages = pages;
      }
      body = resultBody(plan, reported);
    } else {
      body = resultBody(plan, items);
    }
    const frames = [this.header(TYPE.RESULT, epoch, headerStep), body];
    if (msg.timesAsked) frames.push(floatEncoder.encode([msg.received, decoded, executed, now()]));
    if (acting.garble) {
      await this.send([GARBLE]);
    } else {
      await this.send(frames);
      if (acting.duplicate) await this.send(frames);
      if (acting.stale && this.lastResult) await this.send(this.lastResult);
      this.lastResult = frames;
    }
    if (acting['crash-after-reply']) await this.die('crash');

    for (const o of items) cfg.shard.write(o.rid, o.start, o.n, o.pages);
    if (acting['drop-write']) this.dropWrite(items);
  }

  /** Which faults fire on this plan; FIRED for the one-shots among them (§11.1, §11.2). */
  async fire(plan, epoch, step) {
    const acting = {};
    const spent = [];
    for (const f of this.config.faults) {
      if (f.spent || !(f.repeat ? plan.step >= f.step : plan.step === f.step)) continue;
      acting[f.kind] = f;
      if (!f.repeat) {
        f.spent = true;
        spent.push(f.text);
      }
    }
    if (spent.length > 0) {
      // Drop spent one-shots for good; a replacement is never handed them again.
      this.config.faults = this.config.faults.filter((f) => !f.spent);
      await this.send([this.header(TYPE.FIRED, epoch, step), encoder.encode(spent.slice(0, 64))]);
    }
    return acting;
  }

  /** `drop-write`: empties the last page-run written (the last page of the last item that wrote any). */
  dropWrite(items) {
    const ps = this.config.shard.pageSize;
    for (let i = items.length - 1; i >= 0; i--) {
      const o = items[i];
      if (o.pages.length === 0) continue;
      const k = o.pages.length - 1;
      const firstLogical = Math.floor(o.start / ps);
      for (let p = o.start; p < o.start + o.n; p++) {
        if (Math.floor(p / ps) - firstLogical === k) this.config.shard.clearIf(o.pages[k], p % ps, o.rid, p);
      }
      return;
    }
  }

  /** Lets what was sent leave (a linger of up to 2 s), then SIGKILL (crash) or exit 0 (exit). */
  async die(how) {
    process.stderr.write(`${who}: ${how === 'crash' ? 'crashes' : 'exits'} as its fault says\n`);
    this.sock.linger = 2000;
    this.sock.close();
    await sleep(100);
    if (how === 'crash') process.kill(process.pid, 'SIGKILL');
    process.exit(EXIT.OK);
  }

  /**
   * Waits, without spinning, until the monotonic clock reaches `until` seconds. Timers (which keep the
   * event loop free, so a closed connection is still noticed) take all but the last 2 ms, whose
   * millisecond granularity would stretch every step; that tail is a timed Atomics.wait, precise to
   * microseconds, which blocks the thread for at most 2 ms and never spins.
   */
  async waitUntil(until) {
    for (let left = until - now(); left > 0; left = until - now()) {
      if (left > 0.003) await sleep(Math.floor(left * 1000) - 2);
      else blockFor(left * 1000);
    }
  }

}

function main() {
  const args = parseArgs(process.argv.slice(2));
  who = `worker-js rank ${args.rank}`;
  const secret = readSecret();
  const worker = new Worker(args, secret);
  worker.run().catch((err) => {
    if (err instanceof ProtocolError) leave(EXIT.PROTOCOL, `protocol error: ${err.message}`);
    leave(EXIT.GONE, `failed: ${err && err.stack ? err.stack.split('\n')[0] : err}`);
  });
}

main();
