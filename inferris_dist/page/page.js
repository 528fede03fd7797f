// inferris-dist html: the page's script. It reads the run's data (the JSON block the
// builder, inferris_dist/page, put in the page) and draws it on a canvas: lanes for
// the scheduler, the ranks and the requests, counter tracks, marks; a click on a step shows its
// plan, every rank's result and the join. It uses no library and loads nothing: the page's
// Content-Security-Policy allows this script by its hash, and no connection at all. Every text
// from the log is put on the page as text (textContent), never as markup.
(function page(given) {
'use strict';
var D = given;                          // a live page's news (live.js), else the page's own data
try {
  if (D === undefined) D = JSON.parse(document.getElementById('data').textContent);
} catch (err) {
  document.getElementById('run').textContent = 'the page holds no readable data: ' + err;
  return;
}
const $ = (id) => document.getElementById(id);
const S = D.strs || [];
const txt = (i) => (Number.isInteger(i) && i >= 0 && i < S.length ? S[i] : '');

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}
function add(parent, tag, cls, text) {
  const e = el(tag, cls, text);
  parent.appendChild(e);
  return e;
}
function hb(n) {
  if (!(n >= 0)) return '-';
  if (n < 1024) return n + ' B';
  if (n < 1048576) return (n / 1024).toFixed(1) + ' kB';
  return (n / 1048576).toFixed(1) + ' MB';
}
function ft(us) {                       // a duration in microseconds
  if (!(us === us)) return '-';
  const a = Math.abs(us);
  if (a < 1000) return (a < 10 ? us.toFixed(1) : us.toFixed(0)) + ' \u00b5s';
  if (a < 1e6) return (us / 1000).toFixed(a < 1e4 ? 2 : 1) + ' ms';
  return (us / 1e6).toFixed(a < 1e8 ? 3 : 1) + ' s';
}
const at = (us) => '+' + ft(us);        // a time since the run began
function lowerBound(arr, x) {           // the first index whose value is >= x
  let lo = 0, hi = arr.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (arr[mid] < x) lo = mid + 1; else hi = mid;
  }
  return lo;
}
function ranksText(rs) {
  if (!rs.length) return 'no rank';
  const run = rs.length > 2 && rs.every((r, i) => r === rs[0] + i);
  if (run) return 'ranks ' + rs[0] + '-' + rs[rs.length - 1];
  return (rs.length === 1 ? 'rank ' : 'ranks ') + rs.join(', ');
}
function vt(v) {                        // a value of a plan or a result, as text
  if (v === null || v === undefined) return '-';
  if (Array.isArray(v)) {
    if (!v.length) return '-';
    return v.every(Number.isInteger) ? v.join(',') : JSON.stringify(v);
  }
  if (typeof v === 'object') return JSON.stringify(v);
  return String(v);
}

// -- the model -------------------------------------------------------------------------------
// Everything the frames draw is indexed here once, by time: each kind of span or mark in its
// own list sorted by its start, with a typed array of the starts and the longest duration, so
// that a frame finds what is in view by binary search (`inView`) and never scans a whole list.
const KINDS = D.mark_kinds || [];
const span = D.span || [0, 1];
const fitSpan = Array.isArray(D.fit) && D.fit[1] > D.fit[0] ? D.fit : span;
const ranks = D.ranks || [];
const laneOfRank = new Map();
ranks.forEach((r, i) => laneOfRank.set(r, i));
function upperBound(arr, x) {           // the first index whose value is > x
  let lo = 0, hi = arr.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (arr[mid] <= x) lo = mid + 1; else hi = mid;
  }
  return lo;
}
// a list of things with a start `a(x)` and an end `b(x)`, sorted by start, and indexed
function indexed(list, a, b) {
  const items = list.slice().sort((p, q) => a(p) - a(q));
  const t = Float64Array.from(items, a);
  let maxDur = 0;
  for (const x of items) maxDur = Math.max(maxDur, b(x) - a(x));
  return {items: items, t: t, maxDur: maxDur, a: a, b: b};
}
// the first index of `ix` that may be in [lo, hi] (what starts before lo but lasts into it too)
function inView(ix, lo) {
  return lowerBound(ix.t, lo - ix.maxDur);
}

const attempts = (D.attempts || []).map((r, i) => {
  const a = r[2];
  const rts = r[7].map((w) => {
    const sent = a + w[1];
    const back = w[2] >= 0 ? sent + w[2] : NaN;
    let inside = null;
    if (w.length >= 9 && w[5] !== null && back === back) {
      const rc = sent + w[5], dc = rc + w[6], ex = dc + w[7], en = ex + w[8];
      inside = [rc, dc, ex, en];
    }
    return {rank: w[0], sent: sent, back: back, bytes: w[3], result: w[4], inside: inside,
            plan: w.length > 9 ? w[9] : r[6]};
  });
  const verdict = txt(r[4]);
  // what the link did to a rank's plan or result ("plan lost"), by rank, where it did anything
  const links = new Map(Array.isArray(r[8]) ? r[8].map((w) => [w[0], txt(w[1])]) : []);
  // a plan sent ahead (overlap) and never read, its epoch having ended: void, not a failure
  const isVoid = verdict.startsWith('void');
  // the log goes on and this attempt's verdict is not in it yet: neither committed nor failed
  const inFlight = verdict.startsWith('in flight');
  return {i: i, step: r[0], epoch: r[1], a: a, b: Math.max(a, r[3]), verdict: verdict,
          ok: verdict === 'joined', void: isVoid, inFlight: inFlight, planBytes: r[5], plan: r[6], rts: rts,
          links: links, arrivals: null};
});
// a joined attempt's arrivals at its join, where the log said them: each rank's result after its
// plan was sent and behind the first to arrive, its own execute time (microseconds; -1: not
// said), and the rank the join waited for (last: -1 under two ranks)
let arrived = 0;
for (const w of Array.isArray(D.arrivals) ? D.arrivals : []) {
  const x = Array.isArray(w) && Number.isInteger(w[0]) ? attempts[w[0]] : undefined;
  if (!x || !Array.isArray(w[2])) continue;
  const rows = w[2].map((r) => ({rank: r[0], after: r[1], behind: r[2], exec: r[3]}));
  x.arrivals = {last: w[1], rows: rows, most: rows.reduce((m, r) => Math.max(m, r.behind), 0)};
  arrived++;
}
const attemptsOf = new Map();
for (const x of attempts) {
  if (!attemptsOf.has(x.step)) attemptsOf.set(x.step, []);
  attemptsOf.get(x.step).push(x);
}
const byStart = attempts.slice().sort((p, q) => p.a - q.a);
const failed = byStart.filter((x) => !x.ok && !x.void && !x.inFlight);
const voided = byStart.filter((x) => x.void);
const inFlight = byStart.filter((x) => x.inFlight);
const failedA = Float64Array.from(failed, (x) => x.a);
const failedMax = failed.reduce((m, x) => Math.max(m, x.b - x.a), 0);

const ST = D.steps || {step: [], epoch: [], a: [], b: [], line: []};
const nSteps = ST.step.length;
const stepA = Float64Array.from(ST.a), stepB = Float64Array.from(ST.b);
let stepMax = 0;
for (let i = 0; i < nSteps; i++) stepMax = Math.max(stepMax, stepB[i] - stepA[i]);
const stepIdx = new Map();
for (let i = 0; i < nSteps; i++) if (!stepIdx.has(ST.step[i])) stepIdx.set(ST.step[i], i);
const idle = (D.idle || []).slice().sort((p, q) => p[2] - q[2]);
const idleA = Float64Array.from(idle, (r) => r[2]);
const idleMax = idle.reduce((m, r) => Math.max(m, r[3] - r[2]), 0);
const idleByFirst = idle.slice().sort((p, q) => p[0] - q[0]);
const idleFirst = Float64Array.from(idleByFirst, (r) => r[0]);
function idleOf(k) {                    // the idle stretch holding step k, or null
  const j = upperBound(idleFirst, k) - 1;
  return j >= 0 && k <= idleByFirst[j][1] ? idleByFirst[j] : null;
}
const stepList = Array.from(new Set(ST.step.concat(attempts.map((x) => x.step)))).sort((p, q) => p - q);

const phases = (D.phases || []).slice().sort((p, q) => p[2] - q[2]);
const phaseA = Float64Array.from(phases, (r) => r[2]);
const phaseMax = phases.reduce((m, r) => Math.max(m, r[3]), 0);
const PHASE = ['prepare', 'execute', 'commit', 'recover'];
const COL = {prepare: '#5b8def', execute: '#f0a030', commit: '#3fae6a', recover: '#e0504a',
  rt: '#c6d4e9', rtFail: '#f2a09a', last: '#b45309', rtLost: '#f6c9c5', rtVoid: '#e3e6ea', decode: '#8e6bd1', exec: '#2a9d8f',
  encode: '#d9a400', audit: '#7b8fe0', hand: '#a9dbb3', wait: '#f7c98b', lost: '#d62728',
  restart: '#ef7d0d', note: '#7d8590', peer: '#9b4dca', replaced: '#2f9e44', end: '#333',
  link: '#0e7490', cut: '#0e7490', resize: '#a8327d', grow: '#2f9e44',
  waiting: '#ead9a6', running: '#4e9a6a', preempted: '#ec8f43', grid: '#eef0f3'};

const marks = (D.marks || []).map((r, i) => ({i: i, kind: KINDS[r[0]] || '?', t: r[1], dur: r[2],
  ranks: r[3], step: r[4], epoch: r[5], text: txt(r[6])}));
const RANKED = new Set(['lost', 'restart', 'replaced', 'note', 'audit-failed', 'rejoin-wait',
  'refused', 'link', 'partition', 'resize']);
const TOP = new Set(['lost', 'restart', 'step-failed', 'audit', 'audit-failed', 'end', 'resize']);
const markStart = (m) => m.t, markEnd = (m) => m.t + Math.max(0, m.dur);
const atInstant = (m) => m.t;
const stepMarks = indexed(marks.filter((m) => TOP.has(m.kind)), markStart, atInstant);
const schedMarks = indexed(marks.filter((m) => !m.ranks.length && !TOP.has(m.kind)), markStart, markEnd);
// the losses, restarts and resizes, drawn across every lane
const acrossMarks = indexed(marks.filter((m) => m.kind === 'lost' || m.kind === 'restart' ||
  m.kind === 'resize'), markStart, atInstant);
const marksOfStep = new Map();
for (const m of marks) {
  if (m.step < 0) continue;
  if (!marksOfStep.has(m.step)) marksOfStep.set(m.step, []);
  marksOfStep.get(m.step).push(m);
}
const markCount = {};
for (const m of marks) markCount[m.kind] = (markCount[m.kind] || 0) + 1;
// where each epoch began: the restarts and resizes (all of them, beyond the marks' budget), in time order
const epochList = (Array.isArray(D.epochs) ? D.epochs : marks.filter((m) => m.kind === 'restart' &&
  m.epoch >= 0).map((m) => [m.t, m.epoch])).slice().sort((p, q) => p[0] - q[0]);
const epochT = Float64Array.from(epochList, (e) => e[0]);
function epochAt(t) {                   // the epoch at time t (0 before the first restart)
  const j = upperBound(epochT, t) - 1;
  return j >= 0 ? epochList[j][1] : 0;
}
// the world's size: what the run asked for, and each change [step, from, to, time, why, epoch]
const WORLD = D.world && typeof D.world === 'object' ? D.world : {};
const worldChanges = (Array.isArray(WORLD.changes) ? WORLD.changes : []).filter((c) => Array.isArray(c) &&
  Number.isInteger(c[0]) && Number.isInteger(c[1]) && Number.isInteger(c[2]));
const worldAsked = Number.isInteger(WORLD.requested) ? WORLD.requested
  : worldChanges.length ? worldChanges[0][1] : ranks.length;
const worldNow = worldChanges.length ? worldChanges[worldChanges.length - 1][2] : worldAsked;

// each rank: its round trips (sorted by send), processes, audits, joins, waits and marks
const members = (D.members || []).slice().sort((p, q) => p[4] - q[4]);
const R = ranks.map((r) => ({rank: r, list: [], audits: [], hands: [], waits: [], cuts: [], marks: [],
  own: [], pids: [], host: ''}));
for (const x of attempts) {
  for (const rt of x.rts) {
    const L = R[laneOfRank.get(rt.rank)];
    if (L) L.list.push({x: x, rt: rt});
  }
}
for (const L of R) {
  L.list.sort((p, q) => p.rt.sent - q.rt.sent);
  const n = L.list.length;
  L.st = new Float64Array(n);
  L.en = new Float64Array(n);
  L.maxDur = 0;
  L.list.forEach((it, j) => {
    const e = it.rt.back === it.rt.back ? it.rt.back : Math.max(it.x.b, it.rt.sent);
    L.st[j] = it.rt.sent;
    L.en[j] = e;
    L.maxDur = Math.max(L.maxDur, e - it.rt.sent);
  });
}
for (const r of D.audits || []) {
  const L = R[laneOfRank.get(r[0])];
  if (L) L.audits.push({a: r[1], b: Math.max(r[1], r[2]), bytes: r[3], step: r[4]});
}
for (const r of D.handshakes || []) {
  const L = R[laneOfRank.get(r[0])];
  if (L) L.hands.push({a: r[1], b: Math.max(r[1], r[2])});
}
for (const m of marks) {
  if (!RANKED.has(m.kind)) continue;
  for (const r of m.ranks) {
    const L = R[laneOfRank.get(r)];
    if (!L) continue;
    if (m.kind === 'rejoin-wait') L.waits.push(m);
    else {
      if (m.kind === 'partition') L.cuts.push(m);       // its span, and its mark where it began
      L.marks.push(m);
    }
  }
}
for (const m of members) {
  const L = R[laneOfRank.get(m[0])];
  if (L) L.own.push(m);
}
const lastT = Math.max(span[1], 0);
const spanStart = (s) => s.a, spanEnd = (s) => s.b;
for (const L of R) {
  L.audits = indexed(L.audits, spanStart, spanEnd);
  L.hands = indexed(L.hands, spanStart, spanEnd);
  L.waits = indexed(L.waits, markStart, markEnd);
  L.cuts = indexed(L.cuts, markStart, markEnd);
  L.marks = indexed(L.marks, markStart, markEnd);
  // its processes: each from its admission (or a resize renumbering it here) to the next one's,
  // or to a loss of the rank before, or a resize (the rank gone from the world, or joined anew)
  const losses = Float64Array.from(L.marks.items.filter((m) => m.kind === 'lost' || m.kind === 'resize'),
    (m) => m.t);
  const n = L.own.length;
  L.procA = new Float64Array(n);
  L.procB = new Float64Array(n);
  L.own.forEach((m, j) => {
    let b = j + 1 < n ? L.own[j + 1][4] : lastT;
    const k = upperBound(losses, m[4]);
    if (k < losses.length && losses[k] < b) b = losses[k];
    L.procA[j] = m[4];
    L.procB[j] = Math.max(m[4], b);
    const host = txt(m[3]);
    if (host) L.host = host;
    if (!L.pids.length || L.pids[L.pids.length - 1] !== m[2]) L.pids.push(m[2]);
  });
}
// the band of rank lane L at time t: its process and epoch there, or null
function bandAt(L, t) {
  const j = upperBound(L.procA, t) - 1;
  if (j < 0 || t > L.procB[j]) return null;
  const m = L.own[j];
  const k = upperBound(epochT, t) - 1;
  // the epoch's bounds within the process's
  const a = Math.max(L.procA[j], k >= 0 ? epochT[k] : -Infinity);
  const b = Math.min(L.procB[j], k + 1 < epochT.length ? epochT[k + 1] : Infinity);
  return {a: a, b: b, pid: m[2], host: txt(m[3]), epoch: Math.max(epochAt(t), m[1]),
    was: m.length > 5 ? m[5] : null};
}

// counter tracks
function series(t, values) {
  const v = Float64Array.from(values, (x) => (typeof x === 'number' ? x : NaN));
  let max = 0;
  for (const x of v) if (x > max) max = x;
  return {t: t, v: v, max: max};
}
const C = D.counters || {};
const attT = Float64Array.from(byStart, (x) => x.a);
const TRACKS = [];
function track(label, parts) {
  const ss = parts.filter((p) => p[0]);
  if (!ss.length) return;
  let max = 1;
  for (const p of ss) max = Math.max(max, p[0].max);
  TRACKS.push({label: label, parts: ss, max: max});
}
const cs = (k) => (C[k] ? series(stepB, C[k]) : null);
track('requests', [[cs('requests_running'), COL.running, 'running'],
  [cs('requests_waiting'), '#c79a1e', 'waiting'], [cs('requests_preempted'), COL.preempted, 'preempted']]);
track('batch tokens', [[cs('batch_tokens'), '#5b8def', 'batch tokens']]);
track('pages', [[cs('pages_free'), '#3fae6a', 'free'], [cs('pages_cached'), '#8e6bd1', 'cached']]);
track('wire bytes', [[series(attT, byStart.map((x) => (x.planBytes >= 0 ? x.planBytes : null))),
  '#5b8def', 'plan'], [series(attT, byStart.map((x) => x.rts.reduce((m, r) => Math.max(m, r.bytes), -1))
  .map((b) => (b >= 0 ? b : null))), '#e0504a', 'result']]);

// the request lanes: each [t0, state, dur, state, dur, ...] as its segments' bounds and states
const RQ = D.requests || {ids: [], lanes: [], info: [], total: 0, more: 0};
const STATES = ['waiting', 'running', 'preempted', 'changing'];
const REQ = (RQ.lanes || []).map((w) => {
  const n = Array.isArray(w) && w.length > 2 ? (w.length - 1) >> 1 : 0;
  const t = new Float64Array(n + 1), s = new Uint8Array(n);
  if (n) t[0] = w[0];
  for (let k = 0; k < n; k++) {
    s[k] = w[1 + 2 * k];
    t[k + 1] = t[k] + Math.max(0, w[2 + 2 * k]);
  }
  return {t: t, s: s, n: n};
});
function segmentAt(q, t, tol) {         // the segment of request lane q at time t (within tol), or -1
  if (!q.n || t < q.t[0] - tol || t > q.t[q.n] + tol) return -1;
  return Math.max(0, Math.min(q.n - 1, upperBound(q.t, t) - 1));
}

// -- the lanes -------------------------------------------------------------------------------
const LANES = [];
function lane(kind, h, label, extra) {
  LANES.push(Object.assign({kind: kind, h: h, label: label, y: 0}, extra || {}));
}
lane('steps', 30, 'steps');
lane('sched', 24, 'scheduler');
lane('head', 18, 'ranks: ' + ranks.length);
R.forEach((L) => lane('rank', 44, 'rank ' + L.rank, {R: L}));
if (TRACKS.length) {
  lane('head', 18, 'counters');
  TRACKS.forEach((tk) => lane('counter', 48, tk.label, {track: tk}));
}
lane('head', 18, RQ.more ? 'requests: the first ' + RQ.ids.length + ' of ' + RQ.total
  : 'requests: ' + RQ.ids.length);
RQ.ids.forEach((id, i) => lane('req', 13, id, {req: i}));
let totalH = 0;
for (const L of LANES) { L.y = totalH; totalH += L.h; }
// the lanes as text too (the canvas is a picture): for screen readers, find-in-page and tests
for (const L of LANES) {
  if (L.kind !== 'rank' && L.kind !== 'sched' && L.kind !== 'steps') continue;
  const li = document.createElement('li');
  li.textContent = L.label + (L.R && L.R.pids.length ? ': pid ' + L.R.pids.join(' \u2192 ') : '')
    + (L.R && L.R.host ? ' @ ' + L.R.host : '');
  $('lanes').appendChild(li);
}

// -- drawing ---------------------------------------------------------------------------------
const cv = $('cv'), ctx = cv.getContext('2d'), plot = $('plot');
const GX = 172, AX = 24;
const FONT = '11px system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif';
let W = 600, H = 400, dpr = 1;
let v0 = span[0], v1 = span[1], sy = 0;
let selStep = null, selReq = null, pending = false, frames = 0;
let stats = {frames: 0, marks: {}, roundTrips: 0, steps: 0, phases: 0, requests: 0, lanes: 0, bands: 0};
const X = (t) => GX + (t - v0) * (W - GX) / (v1 - v0);
const T = (x) => v0 + (x - GX) * (v1 - v0) / (W - GX);

function hatch(color, ground) {
  const c = document.createElement('canvas');
  c.width = c.height = 6;
  const g = c.getContext('2d');
  if (ground) { g.fillStyle = ground; g.fillRect(0, 0, 6, 6); }
  g.strokeStyle = color;
  g.lineWidth = 1.5;
  g.beginPath();
  g.moveTo(0, 6); g.lineTo(6, 0); g.moveTo(-1, 1); g.lineTo(1, -1); g.moveTo(5, 7); g.lineTo(7, 5);
  g.stroke();
  return ctx.createPattern(c, 'repeat');
}
const HATCH = {lost: hatch('#d62728'), idle: hatch('#b7bec8'), wait: hatch('#e07b00'), cut: hatch(COL.cut),
  changing: hatch(COL.running, COL.waiting)};

function resize() {
  const r = plot.getBoundingClientRect();
  dpr = window.devicePixelRatio || 1;
  W = Math.max(GX + 100, r.width);
  H = Math.max(AX + 40, r.height);
  cv.width = Math.round(W * dpr);
  cv.height = Math.round(H * dpr);
  clampY();
  draw();
}
function dirty() {
  if (!pending) { pending = true; requestAnimationFrame(draw); }
}
function clampY() { sy = Math.max(0, Math.min(sy, Math.max(0, totalH - (H - AX) + 8))); }
function clampX() {
  const full = Math.max(10, span[1] - span[0]);
  let w = Math.max(2, Math.min(v1 - v0, full * 1.5));
  let c = (v0 + v1) / 2;
  c = Math.max(span[0] - full * 0.25, Math.min(span[1] + full * 0.25, c));
  v0 = c - w / 2; v1 = c + w / 2;
}
function fit() {                        // the run's steps, not the start-up before them
  const full = Math.max(10, fitSpan[1] - fitSpan[0]);
  v0 = fitSpan[0] - full * 0.01; v1 = fitSpan[1] + full * 0.015;
  dirty();
}
function zoom(f, x) {
  const t = T(x === undefined ? (GX + W) / 2 : x);
  v0 = t - (t - v0) * f; v1 = t + (v1 - t) * f;
  clampX(); dirty();
}
function pan(dx) {
  const d = dx * (v1 - v0) / (W - GX);
  v0 += d; v1 += d; clampX(); dirty();
}

function label(text, x, y, maxW, color) {
  if (maxW < 12) return;
  let s = text;
  if (ctx.measureText(s).width > maxW) {
    let lo = 0, hi = s.length;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (ctx.measureText(s.slice(0, mid) + '\u2026').width <= maxW) lo = mid; else hi = mid - 1;
    }
    if (lo < 1) return;
    s = s.slice(0, lo) + '\u2026';
  }
  if (color) ctx.fillStyle = color;
  ctx.fillText(s, x, y);
}
function box(a, b, y, h, fill) {          // a span drawn; how wide it shows (0: not at all)
  let x0 = X(a), x1 = X(b);
  if (x1 < GX || x0 > W) return 0;
  if (x1 - x0 < 1) x1 = x0 + 1;
  ctx.fillStyle = fill;
  ctx.fillRect(x0, y, x1 - x0, h);
  return Math.min(W, x1) - Math.max(GX, x0);
}

// A mark's icon is strokes or a fill or both; the icons of one kind in a lane are drawn as one
// path, stroked and filled once (`icons`).
const ICON_STROKE = {lost: COL.lost, 'step-failed': COL.lost, link: COL.link, partition: COL.cut, end: COL.end};
const ICON_FILL = {restart: COL.restart, replaced: COL.replaced, audit: COL.audit, 'audit-failed': COL.lost,
  'turned-away': COL.peer, refused: COL.peer, end: COL.end, resize: COL.resize};
function iconStrokes(kind, x, y, s) {
  if (kind === 'lost' || kind === 'step-failed') {
    ctx.moveTo(x - s, y - s); ctx.lineTo(x + s, y + s); ctx.moveTo(x + s, y - s); ctx.lineTo(x - s, y + s);
  } else if (kind === 'link') {                 // a ring: the link did something to a message
    ctx.moveTo(x + s, y); ctx.arc(x, y, s, 0, 6.3);
    ctx.moveTo(x - s, y + s); ctx.lineTo(x + s, y - s);
  } else if (kind === 'partition') {            // a cut: two strokes across the lane
    ctx.moveTo(x - s, y + s + 1); ctx.lineTo(x - 1, y - s - 1);
    ctx.moveTo(x + 1, y + s + 1); ctx.lineTo(x + s, y - s - 1);
  } else if (kind === 'end') {
    ctx.moveTo(x, y - s - 2); ctx.lineTo(x, y + s + 2);
  }
}
function iconFill(kind, x, y, s) {
  if (kind === 'restart' || kind === 'replaced') {
    ctx.moveTo(x, y - s - 1); ctx.lineTo(x + s + 1, y + s); ctx.lineTo(x - s - 1, y + s); ctx.closePath();
  } else if (kind === 'audit' || kind === 'audit-failed') {
    ctx.moveTo(x, y - s); ctx.lineTo(x + s, y); ctx.lineTo(x, y + s); ctx.lineTo(x - s, y); ctx.closePath();
  } else if (kind === 'turned-away' || kind === 'refused') {
    ctx.rect(x - s + 1, y - s + 1, 2 * s - 2, 2 * s - 2);
  } else if (kind === 'end') {
    ctx.rect(x, y - s - 2, s + 2, s);
  } else if (kind === 'resize') {              // an hourglass: the world's size changed
    ctx.moveTo(x - s, y - s - 1); ctx.lineTo(x + s, y - s - 1); ctx.lineTo(x - s, y + s + 1);
    ctx.lineTo(x + s, y + s + 1); ctx.closePath();
  } else {                                      // a note, and what this page does not know
    ctx.moveTo(x + s - 1, y); ctx.arc(x, y, s - 1, 0, 6.3);
  }
}
function icons(kind, xs, y, s) {        // the icons of one kind at xs (sets the line width and styles)
  if (ICON_STROKE[kind]) {
    ctx.lineWidth = 2;
    ctx.strokeStyle = ICON_STROKE[kind];
    ctx.beginPath();
    for (const x of xs) iconStrokes(kind, x, y, s);
    ctx.stroke();
  }
  if (ICON_FILL[kind] || !ICON_STROKE[kind]) {
    ctx.fillStyle = ICON_FILL[kind] || COL.note;
    ctx.beginPath();
    for (const x of xs) iconFill(kind, x, y, s);
    ctx.fill();
  }
}
const WORD = {lost: 'lost', restart: 'restart', replaced: 'new pid', 'step-failed': 'failed',
  'audit-failed': 'audit failed', end: 'end', link: 'link', partition: 'cut off', resize: 'resize'};

function drawMarks(ix, y, h, seen, words) {
  // the marks of `ix` in view; at most one of each kind a pixel (a flood of them costs the
  // pixels it covers, not its length), every one of them counted as seen
  const tol = 4 * (v1 - v0) / (W - GX);
  const list = ix.items;
  const lastX = {}, xs = {};
  let textEnd = -1e9;
  for (let j = inView(ix, v0 - tol); j < list.length && ix.t[j] <= v1 + tol; j++) {
    const m = list[j];
    if (m.t < v0 - tol || m.kind === 'rejoin-wait') continue;
    const x = X(m.t);
    seen.add(m.i);
    if (x - (lastX[m.kind] === undefined ? -1e9 : lastX[m.kind]) < 3) continue;
    lastX[m.kind] = x;
    (xs[m.kind] || (xs[m.kind] = [])).push(x);
    if (words && WORD[m.kind]) {
      ctx.font = 'bold ' + FONT;
      const lx = Math.max(x + 7, textEnd + 6);          // beside the last word, never over it
      const w = ctx.measureText(WORD[m.kind]).width;
      if (lx - x < 90) {
        label(WORD[m.kind], lx, y + h / 2, 80, m.kind === 'restart' ? '#b35900'
          : m.kind === 'replaced' ? '#1f6f30' : m.kind === 'end' ? COL.end : m.kind === 'resize' ? COL.resize
            : m.kind === 'link' || m.kind === 'partition' ? COL.link : COL.lost);
        textEnd = lx + w;
      }
      ctx.font = FONT;
    }
  }
  for (const kind of Object.keys(xs)) icons(kind, xs[kind], y + h / 2, 4);
}

function drawSteps(y, h, st) {
  let i = lowerBound(stepA, v0 - stepMax);
  ctx.textAlign = 'center';
  let lastX = -1e9;
  for (; i < nSteps && stepA[i] <= v1; i++) {
    if (stepB[i] < v0) continue;
    st.steps++;
    const x0 = X(stepA[i]), x1 = X(stepB[i]);
    if (x1 - x0 < 1 && x0 - lastX < 1) continue;       // under a pixel already drawn
    lastX = x0;
    const w = box(stepA[i], stepB[i], y + 3, h - 6, ST.step[i] % 2 ? '#c9d2de' : '#dbe1ea');
    if (w > 22) {
      const a = Math.max(GX, x0), b = Math.min(W, x1);
      label(String(ST.step[i]), (a + b) / 2, y + h / 2, b - a - 4, '#223');
    }
  }
  ctx.textAlign = 'left';
  lastX = -1e9;
  for (let j = lowerBound(idleA, v0 - idleMax); j < idle.length && idleA[j] <= v1; j++) {
    const r = idle[j];
    if (X(r[3]) - X(r[2]) < 1 && X(r[2]) - lastX < 1) continue;
    lastX = X(r[2]);
    const w = box(r[2], r[3], y + 5, h - 10, HATCH.idle);
    if (w > 40) {
      label('idle ' + (r[0] === r[1] ? r[0] : r[0] + '-' + r[1]), Math.max(GX, X(r[2])) + 3, y + h / 2,
        w - 6, '#556');
    }
  }
  lastX = -1e9;
  for (let j = lowerBound(failedA, v0 - failedMax); j < failed.length && failedA[j] <= v1; j++) {
    const x = failed[j];
    if (X(x.b) - X(x.a) < 1 && X(x.a) - lastX < 1) continue;
    lastX = X(x.a);
    const w = box(x.a, x.b, y + h / 2, h / 2 - 3, '#e0504a');
    if (w > 50) label('step ' + x.step + ' failed', Math.max(GX, X(x.a)) + 3, y + h * 0.75, w - 6, '#fff');
  }
  if (selStep !== null) {
    const s = stepSpan(selStep);
    if (s) {
      ctx.strokeStyle = '#1d4ed8'; ctx.lineWidth = 2;
      ctx.strokeRect(X(s[0]), y + 2, Math.max(2, X(s[1]) - X(s[0])), h - 4);
    }
  }
}

function drawSched(y, h, st, seen) {
  let i = lowerBound(phaseA, v0 - phaseMax);
  let lastX = -1e9;
  for (; i < phases.length && phaseA[i] <= v1; i++) {
    const r = phases[i];
    const x0 = X(r[2]), x1 = X(r[2] + r[3]);
    if (x1 < GX) continue;
    if (x1 - x0 < 1 && x0 - lastX < 1) continue;
    lastX = x0;
    st.phases++;
    const w = box(r[2], r[2] + r[3], y + 3, h - 6, COL[PHASE[r[0]]] || '#999');
    if (w > 46) label(PHASE[r[0]] + ' ' + r[1], Math.max(GX, x0) + 3, y + h / 2, w - 6, '#fff');
  }
  if (D.startup && D.startup[1] > D.startup[0]) {
    const w = box(D.startup[0], D.startup[1], y + 5, h - 10, HATCH.idle);
    const x0 = Math.max(GX, X(D.startup[0])) + 3;
    if (w > 90) label('start-up: the ranks join', x0, y + h / 2, w - 6, '#445');
  }
  const list = schedMarks.items;
  lastX = -1e9;
  for (let j = inView(schedMarks, v0); j < list.length && schedMarks.t[j] <= v1; j++) {
    const m = list[j];
    if (m.kind !== 'rejoin-wait' || m.t + m.dur < v0) continue;
    seen.add(m.i);
    if (X(m.t + m.dur) - X(m.t) < 1 && X(m.t) - lastX < 1) continue;
    lastX = X(m.t);
    box(m.t, m.t + m.dur, y + 3, h - 6, HATCH.wait);
  }
  drawMarks(schedMarks, y, h, seen, false);
}

// a lane's spans of `ix` in view, each drawn by `each(x, w)`, at most one a pixel
function spans(ix, each) {
  const list = ix.items;
  let lastX = -1e9;
  for (let j = inView(ix, v0); j < list.length && ix.t[j] <= v1; j++) {
    const s = list[j], a = ix.a(s), b = ix.b(s);
    if (b < v0) continue;
    const x0 = X(a), x1 = X(b);
    if (x1 - x0 < 1 && x0 - lastX < 1) continue;
    lastX = x0;
    each(s, a, b);
  }
}

function drawBands(L, y, sh, st) {
  // a rank's processes and epochs in view: one band for each process in each epoch, labelled
  // where there is room; bands under 3 px wide are drawn together, as one band of many epochs
  const n = L.procA.length;
  let j = Math.max(0, upperBound(L.procA, v0) - 1);
  const px = (v1 - v0) / (W - GX);
  let drawn = 0, steps = 0;
  let denseA = null, denseB = 0, denseFrom = 0, denseTo = 0;
  const flush = () => {
    if (denseA === null) return;
    drawn++;
    const w = box(denseA, denseB, y + 1, sh, '#dde4ee');
    ctx.fillStyle = '#7a8799';
    ctx.fillRect(X(denseA), y + 1, 1, sh);
    const room = Math.min(W, X(denseB)) - Math.max(GX, X(denseA)) - 5;
    if (w && room > 40) {
      label(denseFrom === denseTo ? 'epoch ' + denseFrom : 'epochs ' + denseFrom + '-' + denseTo,
        Math.max(GX, X(denseA)) + 3, y + 1 + sh / 2, room, '#334155');
    }
    denseA = null;
  };
  for (; j < n && L.procA[j] <= v1 && steps < 8 * W; j++) {
    if (L.procB[j] < v0) continue;
    const m = L.own[j];
    let a = Math.max(L.procA[j], v0 - px);
    const end = Math.min(L.procB[j], v1 + px);
    while (a < end && steps < 8 * W) {
      steps++;
      // the band from a to the next epoch's start (or the process's end); a pixel at least
      const k = upperBound(epochT, a);
      let b = k < epochT.length ? Math.min(end, epochT[k]) : end;
      if (X(b) - X(a) < 1) b = Math.min(end, a + px);
      const epoch = Math.max(epochAt(a), m[1]);
      if (X(b) - X(a) < 3) {
        if (denseA !== null && X(a) - X(denseB) >= 1) flush();
        if (denseA === null) { denseA = a; denseFrom = epoch; }
        denseB = b;
        denseTo = epoch;
        a = b;
        continue;
      }
      flush();
      drawn++;
      const w = box(a, b, y + 1, sh, epoch % 2 ? '#d8e2f0' : '#e9eef5');
      if (w) {
        const x0 = Math.max(GX, X(a));
        if (a > v0 - px) { ctx.fillStyle = '#7a8799'; ctx.fillRect(X(a), y + 1, 1, sh); }
        const room = Math.min(W, X(b)) - x0 - 5;
        if (room > 12) {
          const host = txt(m[3]);
          const long = 'pid ' + m[2] + ' \u00b7 epoch ' + epoch + (host ? ' \u00b7 ' + host : '');
          const short = 'pid ' + m[2] + ' \u00b7 e' + epoch;
          label(ctx.measureText(long).width <= room ? long : ctx.measureText(short).width <= room ? short
            : m[2] + ' e' + epoch, x0 + 3, y + 1 + sh / 2, room, '#334155');
        }
      }
      a = b;
    }
    if (X(L.procB[j]) - X(L.procA[j]) < 1) {
      // the processes that begin within the next pixel end there too, but for the last of them
      const last = upperBound(L.procA, L.procA[j] + px) - 1;
      if (last - 1 > j) j = last - 1;
    }
  }
  flush();
  st.bands += drawn;
}

function drawRank(L, y, h, st, seen) {
  const sh = 12;
  ctx.fillStyle = laneOfRank.get(L.rank) % 2 ? '#fbfcfd' : '#ffffff';
  ctx.fillRect(GX, y, W - GX, h);
  drawBands(L, y, sh, st);
  const top = y + sh + 3, rh = h - sh - 6;
  spans(L.hands, (s, a, b) => box(a, b, top, rh, COL.hand));
  spans(L.waits, (m, a, b) => {
    const w = box(a, b, top, rh, HATCH.wait);
    if (w > 70) label('waiting to rejoin', Math.max(GX, X(a)) + 3, top + rh / 2, w - 6, '#7a3d00');
  });
  for (let j = inView(L.waits, v0); j < L.waits.items.length && L.waits.t[j] <= v1; j++) {
    const m = L.waits.items[j];
    if (m.t + m.dur >= v0) seen.add(m.i);
  }
  const n = L.st.length;
  let j = lowerBound(L.st, v0 - L.maxDur);
  // round trips under a pixel wide are gathered by pixel column, each column drawn once in the
  // colour of the worst of them (lost, failed, joined, void), and columns alike side by side
  // drawn as one
  const FILL = [COL.rtVoid, COL.rt, COL.rtFail, HATCH.lost];
  let col = -1e9, worst = -1, runA = 0, runB = -1e9, runSev = -1;
  const paint = () => {
    if (runSev < 0) return;
    ctx.fillStyle = FILL[runSev];
    ctx.fillRect(runA, top, runB - runA + 1, rh);
    runSev = -1;
  };
  const flush = () => {
    if (worst < 0) return;
    if (worst !== runSev || col !== runB + 1) { paint(); runA = col; runSev = worst; }
    runB = col;
    worst = -1;
  };
  for (; j < n && L.st[j] <= v1; j++) {
    const x0 = X(L.st[j]), x1 = X(L.en[j]);
    if (x1 < GX) continue;
    const it = L.list[j];
    const lost = !(it.rt.back === it.rt.back);
    const w = x1 - x0;
    const sev = it.x.void || it.x.inFlight ? 0 : lost ? 3 : it.x.ok ? 1 : 2;
    st.roundTrips++;
    if (w < 1) {
      const c = Math.floor(x0);
      if (c !== col) { flush(); col = c; }
      worst = Math.max(worst, sev);
      continue;
    }
    flush();
    paint();
    ctx.fillStyle = FILL[sev];
    ctx.fillRect(x0, top, w, rh);
    if (sev === 3) {
      ctx.strokeStyle = COL.lost; ctx.lineWidth = 1;
      ctx.strokeRect(x0 + 0.5, top + 0.5, Math.max(1, w - 1), rh - 1);
    }
    if (it.x.arrivals && it.x.arrivals.last === it.rt.rank && w > 3) {
      ctx.fillStyle = COL.last;          // the result the join waited for: its end, marked
      ctx.fillRect(x1 - 2, top - 2, 2, rh + 4);
    }
    const ins = it.rt.inside;
    if (ins && w > 5) {
      const iy = top + rh * 0.42, ih = rh * 0.58;
      box(ins[0], ins[1], iy, ih, COL.decode);
      box(ins[1], ins[2], iy, ih, COL.exec);
      box(ins[2], ins[3], iy, ih, COL.encode);
    }
    if (w > 60) {
      label('step ' + it.x.step + (it.x.ok ? '' : ': ' + it.x.verdict), Math.max(GX, x0) + 3,
        top + rh * 0.22, Math.min(W, x1) - Math.max(GX, x0) - 6, it.x.void ? '#667' : '#223');
    }
  }
  flush();
  paint();
  // a partition, over the round trips it cut: everything to and from it lost
  spans(L.cuts, (m, a, b) => {
    const cy = top + rh * 0.55, ch = rh * 0.45;
    box(a, b, cy, ch, '#ffffff');
    const w = box(a, b, cy, ch, HATCH.cut);
    ctx.strokeStyle = COL.cut; ctx.lineWidth = 1;
    ctx.strokeRect(X(a) + 0.5, cy + 0.5, Math.max(1, X(b) - X(a) - 1), ch - 1);
    seen.add(m.i);
    if (w > 90) label('cut off', Math.max(GX, X(a)) + 3, cy + ch / 2, w - 6, COL.cut);
  });
  spans(L.audits, (s, a, b) => {
    const w = box(a, b, top + rh * 0.25, rh * 0.5, COL.audit);
    if (w > 40) label('audit', Math.max(GX, X(a)) + 3, top + rh / 2, w - 6, '#fff');
  });
  drawMarks(L.marks, y + sh, h - sh, seen, true);
}

function drawCounter(tk, y, h) {
  ctx.fillStyle = '#fcfcfd';
  ctx.fillRect(GX, y, W - GX, h);
  const y0 = y + 4, yh = h - 8;
  const Y = (val) => y0 + yh - (val / tk.max) * yh;
  for (const p of tk.parts) {
    const s = p[0], t = s.t, v = s.v, n = t.length;
    if (!n) continue;
    ctx.strokeStyle = p[1];
    ctx.lineWidth = 1.4;
    ctx.beginPath();
    // a step line; where many values fall in one pixel column, its lowest and highest
    let i = Math.max(0, lowerBound(t, v0) - 1);
    let started = false, lastY = 0, col = -1e9, lo = 0, hi = 0;
    for (; i < n; i++) {
      const val = v[i];
      if (!(val === val)) continue;
      const x = X(t[i]);
      const yy = Y(val);
      if (!started) { ctx.moveTo(Math.max(GX, x), yy); started = true; col = Math.floor(x); lo = hi = yy; }
      else if (Math.floor(x) === col) {
        lo = Math.min(lo, yy); hi = Math.max(hi, yy);
      } else {
        if (lo !== hi) { ctx.lineTo(col, lo); ctx.lineTo(col, hi); }
        ctx.lineTo(x, lastY); ctx.lineTo(x, yy);
        col = Math.floor(x); lo = hi = yy;
      }
      lastY = yy;
      if (x > W) break;
    }
    if (started) {
      if (lo !== hi) { ctx.lineTo(col, lo); ctx.lineTo(col, hi); ctx.lineTo(col, lastY); }
      ctx.lineTo(Math.min(W, X(t[n - 1])), lastY);
    }
    ctx.stroke();
  }
}

function drawRequest(L, y, h, st) {
  const q = REQ[L.req];
  if (!q || !q.n) return;
  const fill = [COL.waiting, COL.running, COL.preempted, HATCH.changing];
  let k = segmentAt(q, v0, 0);
  if (k < 0) k = q.t[0] > v0 ? 0 : q.n;
  let lastX = -1e9;
  for (; k < q.n && q.t[k] <= v1; k++) {
    const x0 = X(q.t[k]);
    if (X(q.t[k + 1]) - x0 < 1 && x0 - lastX < 1) continue;
    lastX = x0;
    box(q.t[k], q.t[k + 1], y + 2, h - 3, fill[q.s[k]] || '#ccc');
    st.requests++;
  }
  const info = RQ.info[L.req];
  if (info && info[1] >= 0) {
    const x = X(q.t[q.n]);
    if (x >= GX && x <= W) { ctx.fillStyle = '#222'; ctx.fillRect(x - 1, y + 1, 2, h - 1); }
  }
}

function drawAxis() {
  ctx.fillStyle = '#f3f5f8';
  ctx.fillRect(0, 0, W, AX);
  ctx.strokeStyle = '#cfd5dd';
  ctx.beginPath(); ctx.moveTo(0, AX - 0.5); ctx.lineTo(W, AX - 0.5); ctx.stroke();
  const ticks = tickList();
  ctx.fillStyle = '#445';
  ctx.textAlign = 'left';
  for (const t of ticks) {
    const x = X(t);
    ctx.fillRect(x, AX - 6, 1, 6);
    label(ft(t), x + 3, AX / 2 - 1, 90, '#445');
  }
  ctx.fillStyle = '#556';
  label('time since the run began', 8, AX / 2 - 1, GX - 12, '#556');
}
function tickList() {
  const want = Math.max(2, (W - GX) / 110);
  const raw = (v1 - v0) / want;
  const p = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map((k) => k * p).find((s) => s >= raw) || 10 * p;
  const out = [];
  for (let t = Math.ceil(v0 / step) * step; t <= v1 && out.length < 200; t += step) out.push(t);
  return out;
}

function stepSpan(k) {
  let a = Infinity, b = -Infinity;
  const i = stepIdx.get(k);
  if (i !== undefined) { a = stepA[i]; b = stepB[i]; }
  for (const x of attemptsOf.get(k) || []) { a = Math.min(a, x.a); b = Math.max(b, x.b); }
  const r = idleOf(k);
  if (r) { a = Math.min(a, r[2]); b = Math.max(b, r[3]); }
  return a <= b ? [a, b] : null;
}

function draw() {
  pending = false;
  frames++;
  const st = {frames: frames, marks: {}, roundTrips: 0, steps: 0, phases: 0, requests: 0, lanes: 0,
    bands: 0};
  const seen = new Set();
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.fillStyle = '#fff';
  ctx.fillRect(0, 0, W, H);
  ctx.font = FONT;
  ctx.textBaseline = 'middle';
  ctx.save();
  ctx.beginPath(); ctx.rect(GX, AX, W - GX, H - AX); ctx.clip();
  ctx.fillStyle = COL.grid;
  for (const t of tickList()) ctx.fillRect(X(t), AX, 1, H - AX);
  if (selStep !== null) {
    const s = stepSpan(selStep);
    if (s) {
      ctx.fillStyle = 'rgba(59, 130, 246, 0.10)';
      ctx.fillRect(X(s[0]), AX, Math.max(2, X(s[1]) - X(s[0])), H - AX);
    }
  }
  for (const L of LANES) {
    const y = L.y - sy + AX;
    if (y + L.h < AX || y > H) continue;
    st.lanes++;
    if (L.kind === 'steps') {
      drawSteps(y, L.h, st);
      drawMarks(stepMarks, y, 12, seen, false);
    } else if (L.kind === 'sched') drawSched(y, L.h, st, seen);
    else if (L.kind === 'rank') drawRank(L.R, y, L.h, st, seen);
    else if (L.kind === 'counter') drawCounter(L.track, y, L.h);
    else if (L.kind === 'req') drawRequest(L, y, L.h, st);
    else if (L.kind === 'head') { ctx.fillStyle = '#eef1f5'; ctx.fillRect(GX, y, W - GX, L.h); }
    ctx.fillStyle = '#e6e9ee';
    ctx.fillRect(GX, y + L.h - 1, W - GX, 1);
  }
  // the losses, restarts and resizes, across every lane, a line a pixel at most of each kind; where
  // more are in view than a line every few pixels, the lines would hide the lanes: not drawn then
  const lastX = {lost: -1e9, restart: -1e9, resize: -1e9};
  const across = acrossMarks.items;
  const first = lowerBound(acrossMarks.t, v0);
  const dense = upperBound(acrossMarks.t, v1) - first > (W - GX) / 4;
  for (let j = first; !dense && j < across.length && acrossMarks.t[j] <= v1; j++) {
    const m = across[j], x = X(m.t);
    if (x - lastX[m.kind] < 1) continue;
    lastX[m.kind] = x;
    ctx.fillStyle = m.kind === 'lost' ? 'rgba(214, 39, 40, 0.45)' : m.kind === 'resize'
      ? 'rgba(168, 50, 125, 0.45)' : 'rgba(239, 125, 13, 0.45)';
    ctx.fillRect(x, AX, 1, H - AX);
  }
  ctx.restore();
  drawGutter();
  drawAxis();
  for (const i of seen) { const k = marks[i].kind; st.marks[k] = (st.marks[k] || 0) + 1; }
  stats = st;
  linkTo();
}

function drawGutter() {
  ctx.fillStyle = '#f7f8fa';
  ctx.fillRect(0, AX, GX, H - AX);
  ctx.fillStyle = '#d5dae1';
  ctx.fillRect(GX - 1, AX, 1, H - AX);
  ctx.textAlign = 'left';
  for (const L of LANES) {
    const y = L.y - sy + AX;
    if (y + L.h < AX || y > H) continue;
    if (L.kind === 'head') {
      ctx.fillStyle = '#e6eaf0';
      ctx.fillRect(0, y, GX - 1, L.h);
      ctx.font = 'bold ' + FONT;
      label(L.label, 8, y + L.h / 2, W - 16, '#334');       // over the lane's empty plot too
      ctx.font = FONT;
    } else if (L.kind === 'rank') {
      ctx.font = 'bold ' + FONT;
      label(L.label, 10, y + 11, GX - 16, '#223');
      ctx.font = FONT;
      const pids = L.R.pids.length ? 'pid ' + L.R.pids.slice(-3).join(' \u2192 ') : '';
      label(pids, 10, y + 24, GX - 16, '#556');
      if (L.R.host) label('@ ' + L.R.host, 10, y + 36, GX - 16, '#556');
    } else if (L.kind === 'counter') {
      label(L.label, 10, y + 10, GX - 16, '#223');
      let x = 10;
      for (const p of L.track.parts.length > 1 ? L.track.parts : []) {
        ctx.fillStyle = p[1];
        ctx.fillRect(x, y + 22, 8, 8);
        label(p[2], x + 11, y + 26, 70, '#445');
        x += 16 + ctx.measureText(p[2]).width;
        if (x > GX - 30) break;
      }
      label('max ' + fmtMax(L.track), 10, y + 39, GX - 16, '#778');
    } else if (L.kind === 'req') {
      const info = RQ.info[L.req];
      const done = info && info[1] >= 0;
      label(L.label, 14, y + L.h / 2, GX - 20, selReq === L.req ? '#1d4ed8' : done ? '#223' : '#8a5a00');
    } else {
      ctx.font = 'bold ' + FONT;
      label(L.label, 10, y + L.h / 2, GX - 16, '#223');
      ctx.font = FONT;
    }
    ctx.fillStyle = '#e6e9ee';
    ctx.fillRect(0, y + L.h - 1, GX - 1, 1);
  }
}
function fmtMax(tk) {
  return tk.label === 'wire bytes' ? hb(tk.max) : String(tk.max);
}

// -- what is under the pointer ---------------------------------------------------------------
function laneAt(y) {
  if (y < AX) return null;
  const yy = y - AX + sy;
  for (const L of LANES) if (yy >= L.y && yy < L.y + L.h) return L;
  return null;
}
function nearMark(ixs, t, tol) {
  // the mark of the lists `ixs` nearest t within tol (a wait or a cut: anywhere in its span)
  let bd = Infinity, found = null;
  for (const ix of [].concat(ixs)) {
    const list = ix.items;
    for (let j = inView(ix, t - tol); j < list.length && ix.t[j] <= t + tol; j++) {
      const m = list[j];
      const inside = t >= m.t && t <= m.t + m.dur;
      const d = m.kind === 'rejoin-wait' ? (inside ? 0 : Infinity)
        : m.kind === 'partition' && inside ? 0 : Math.abs(m.t - t);
      if (d <= tol && d < bd) { found = m; bd = d; }
    }
  }
  return found;
}
function spanAt(ix, t, tol) {           // the last span of `ix` holding t (within tol), or null
  let found = null;
  const list = ix.items;
  for (let j = inView(ix, t - tol); j < list.length && ix.t[j] <= t + tol; j++) {
    const s = list[j];
    if (t >= ix.a(s) - tol && t <= ix.b(s) + tol) found = s;
  }
  return found;
}
function markLines(m) {
  const out = [m.kind + ' at ' + at(m.t) + (m.step >= 0 ? ', step ' + m.step : '') +
    (m.epoch >= 0 ? ', epoch ' + m.epoch : ''), m.text];
  if (m.dur > 0) out.push('for ' + ft(m.dur));
  return out;
}
function rtLines(it) {
  const x = it.x, r = it.rt;
  const out = ['rank ' + r.rank + ': step ' + x.step + ', epoch ' + x.epoch,
    'plan ' + hb(x.planBytes) + ' sent at ' + at(r.sent)];
  if (r.back === r.back) {
    out.push('round trip ' + ft(r.back - r.sent) + ', result ' + hb(r.bytes));
    if (r.inside) {
      const i = r.inside;
      out.push('inside: decode ' + ft(i[1] - i[0]) + ', execute ' + ft(i[2] - i[1]) + ', encode ' +
        ft(i[3] - i[2]));
    }
  } else out.push('no result in the log');
  if (x.links.has(r.rank)) out.push('link: ' + x.links.get(r.rank));
  const came = x.arrivals ? x.arrivals.rows.find((a) => a.rank === r.rank) : undefined;
  if (came) {
    out.push(x.arrivals.last === r.rank ? 'arrived last, ' + ft(came.behind) + ' behind the first: the join ' +
      'waited for it' : 'arrived ' + ft(came.behind) + ' behind the first, ' +
      ft(x.arrivals.most - came.behind) + ' before the last');
  }
  out.push('join: ' + x.verdict);
  return out;
}
function nearest(a, b, maxDur, t, tol) {
  // the span holding t (the latest to start), else the closest within tol; -1 if none
  let best = -1, bd = Infinity;
  for (let i = lowerBound(a, t - maxDur - tol); i < a.length && a[i] <= t + tol; i++) {
    const d = t < a[i] ? a[i] - t : t > b[i] ? t - b[i] : 0;
    if (d <= tol && d <= bd) { best = i; bd = d; }
  }
  return best;
}
function wireLine(x) {
  // "epoch 0: plan 15 B x4, results 11 B each, joined", as launch prints it
  const sizes = new Set(x.rts.filter((r) => r.bytes >= 0).map((r) => r.bytes));
  const res = !sizes.size ? 'no result' : sizes.size === 1 && x.rts.every((r) => r.bytes >= 0)
    ? 'result ' + hb(x.rts[0].bytes) + ' each' : 'results ' + x.rts.map((r) => hb(r.bytes)).join(' ');
  return 'epoch ' + x.epoch + ': plan ' + hb(x.planBytes) + ' x' + x.rts.length + ', ' + res + ', ' +
    x.verdict;
}
function hit(x, y) {
  const L = laneAt(y);
  if (!L) return null;
  if (x < GX) {
    if (L.kind === 'req') return {lines: requestLines(L.req), req: L.req};
    if (L.kind === 'rank') {
      return {lines: [L.label, L.R.pids.length ? 'processes: pid ' + L.R.pids.join(', ') : '',
        L.R.host ? 'host ' + L.R.host : 'on the scheduler\'s host'].filter(Boolean)};
    }
    return null;
  }
  const t = T(x), tol = 4 * (v1 - v0) / (W - GX);
  const ly = y - (L.y - sy + AX);
  if (L.kind === 'steps') {
    const m = ly < 14 ? nearMark(stepMarks, t, tol) : null;
    if (m) return {lines: markLines(m), mark: m, step: m.step >= 0 ? m.step : null};
    for (let j = lowerBound(failedA, t - failedMax) ; j < failed.length && failedA[j] <= t + tol; j++) {
      const f = failed[j];
      if (ly > L.h / 2 && t >= f.a - tol && t <= f.b + tol) {
        return {lines: ['step ' + f.step + ', epoch ' + f.epoch + ': ' + f.verdict], step: f.step};
      }
    }
    const i = nearest(stepA, stepB, stepMax, t, tol);
    if (i >= 0) {
      return {lines: ['step ' + ST.step[i] + ' (epoch ' + ST.epoch[i] + '), ' + ft(stepB[i] - stepA[i]),
        ST.line[i] || 'nothing happened'].concat((attemptsOf.get(ST.step[i]) || []).map(wireLine)),
        step: ST.step[i]};
    }
    for (let j = lowerBound(idleA, t - idleMax); j < idle.length && idleA[j] <= t; j++) {
      const r = idle[j];
      if (t >= r[2] && t <= r[3]) {
        return {lines: ['steps ' + r[0] + '-' + r[1] + ': idle', 'empty plans, answered by the scheduler: ' +
          'no round trip'], step: r[0]};
      }
    }
    return null;
  }
  if (L.kind === 'sched') {
    const m = nearMark(schedMarks, t, tol);
    if (m) return {lines: markLines(m), mark: m};
    let best = null;
    for (let i = lowerBound(phaseA, t - phaseMax); i < phases.length && phaseA[i] <= t + tol; i++) {
      const r = phases[i];
      if (t >= r[2] - tol && t <= r[2] + r[3] + tol) best = r;
    }
    if (best) {
      return {lines: [PHASE[best[0]] + ' of step ' + best[1], ft(best[3]) + ' from ' + at(best[2])],
        step: best[1] >= 0 ? best[1] : null};
    }
    if (D.startup && t >= D.startup[0] && t <= D.startup[1]) {
      return {lines: ['start-up: ' + ft(D.startup[1] - D.startup[0]), 'from the run\'s start to its first ' +
        'plan: the ranks are started and join (HELLO, CONFIG, READY)']};
    }
    return null;
  }
  if (L.kind === 'rank') {
    const Rk = L.R;
    const m = nearMark([Rk.marks, Rk.waits], t, tol);
    if (m) return {lines: markLines(m), mark: m, step: m.step >= 0 ? m.step : null};
    if (ly < 14) {
      const b = bandAt(Rk, t);
      if (b) {
        return {lines: [L.label + ': pid ' + b.pid + ', epoch ' + b.epoch, b.host ? 'host ' + b.host
          : 'on the scheduler\'s host', 'from ' + at(b.a) + ' to ' + at(b.b)].concat(b.was === null ? []
          : ['rank ' + b.was + ' before a resize renumbered it'])};
      }
    }
    const j = nearest(Rk.st, Rk.en, Rk.maxDur, t, tol);
    if (j >= 0) return {lines: rtLines(Rk.list[j]), step: Rk.list[j].x.step};
    const s = spanAt(Rk.audits, t, tol);
    if (s) {
      return {lines: ['audit at step ' + s.step + ': ' + L.label + ' sent its shard, ' + hb(s.bytes),
        ft(s.b - s.a) + ' from ' + at(s.a)], step: s.step};
    }
    const hs = spanAt(Rk.hands, t, tol);
    if (hs) return {lines: [L.label + ' joined: HELLO to READY in ' + ft(hs.b - hs.a), 'from ' + at(hs.a)]};
    return null;
  }
  if (L.kind === 'counter') {
    const out = [L.label + ' at ' + at(t)];
    for (const p of L.track.parts) {
      const i = lowerBound(p[0].t, t + 1e-9) - 1;
      const val = i >= 0 ? p[0].v[i] : NaN;
      out.push(p[2] + ': ' + (val === val ? (L.label === 'wire bytes' ? hb(val) : val) : '-'));
    }
    return {lines: out};
  }
  if (L.kind === 'req') {
    const q = REQ[L.req];
    const k = q ? segmentAt(q, t, tol) : -1;
    if (k >= 0) {
      return {lines: [L.label + ': ' + segmentWords(L.req, k) + ' for ' + ft(q.t[k + 1] - q.t[k]),
        'from ' + at(q.t[k])].concat(requestLines(L.req).slice(1)), req: L.req};
    }
    return {lines: requestLines(L.req), req: L.req};
  }
  return null;
}
function segmentWords(i, k) {             // "running", or what a coarse stretch stands for
  const q = REQ[i], info = RQ.info[i] || [];
  const state = STATES[q.s[k]] || '?';
  if (q.s[k] !== 3) return state;
  return 'changing state (waiting and running by turns: the page keeps this lane at ' +
    (info[5] || 2) + '-step resolution)';
}
function requestLines(i) {
  const info = RQ.info[i] || [-1, -1, '', 0, 0];
  return ['request ' + RQ.ids[i], 'admitted at step ' + info[0] + ', ran in ' + info[3] + ' step(s)' +
    (info[4] ? ', preempted ' + info[4] + ' time(s)' : ''),
    info[1] >= 0 ? 'finished at step ' + info[1] + (info[2] ? ' (' + info[2] + ')' : '') : 'not finished'];
}

// -- the detail panel --------------------------------------------------------------------------
const P = $('detail');
function table(parent, head, rows, numeric) {
  const t = add(parent, 'table');
  const hr = add(add(t, 'thead'), 'tr');
  head.forEach((h, i) => add(hr, 'th', numeric.has(i) ? 'n' : '', h));
  const body = add(t, 'tbody');
  for (const r of rows) {
    const tr = add(body, 'tr');
    r.cells.forEach((v, i) => add(tr, 'td', numeric.has(i) ? 'n' : '', v));
    if (r.rest !== undefined) {
      const td = add(tr, 'td', '', r.rest);
      td.colSpan = Math.max(1, head.length - r.cells.length);
    }
  }
  return t;
}
function decodeText(v) {
  return v === true ? 'yes' : v === false ? 'no' : vt(v);
}
function planTable(plan) {
  const rows = plan.map((row, j) => (Array.isArray(row)
    ? {cells: [j, vt(row[0]), vt(row[1]), vt(row[2]), vt(row[3]), decodeText(row[4]), vt(row[5]),
      vt(row[6])].concat(row.length > 7 ? [vt(row[7])] : [])}
    : {cells: [j], rest: vt(row)}));
  const head = ['item', 'request', 'start', 'tokens', 'draft', 'decode', 'verdict', 'pages'];
  if (plan.some((r) => Array.isArray(r) && r.length > 7)) head.push('more');
  return table(P, head, rows, new Set([0, 2, 3, 4, 6]));
}
function resultTables(x) {
  const rts = x.rts.slice().sort((p, q) => p.rank - q.rank);
  const head = ['rank', 'sent', 'round trip', 'decode', 'execute', 'encode'];
  if (x.links.size) head.push('link');          // what the link did to the rank's plan or result
  table(P, head, rts.map((r) => {
    const ins = r.inside;
    const cells = [r.rank, at(r.sent), r.back === r.back ? ft(r.back - r.sent) : 'no answer',
      ins ? ft(ins[1] - ins[0]) : '-', ins ? ft(ins[2] - ins[1]) : '-', ins ? ft(ins[3] - ins[2]) : '-'];
    if (x.links.size) cells.push(x.links.get(r.rank) || '');
    return {cells: cells};
  }), new Set([0, 1, 2, 3, 4, 5]));
  const rows = [];
  const first = rts.find((r) => r.result >= 0);
  for (const r of rts) {
    if (!(r.back === r.back)) {
      const why = x.links.has(r.rank) ? ' (link: ' + x.links.get(r.rank) + ')' : '';
      rows.push({cells: [r.rank, '-'], rest: 'no result in the log' + why});
      continue;
    }
    if (r.result < 0) {
      rows.push({cells: [r.rank, hb(r.bytes)], rest: 'result not kept (page size)'});
      continue;
    }
    if (first && r !== first && r.result === first.result) {
      rows.push({cells: [r.rank, hb(r.bytes)], rest: 'same as rank ' + first.rank});
      continue;
    }
    const body = (D.results || [])[r.result];
    if (typeof body === 'string') { rows.push({cells: [r.rank, hb(r.bytes)], rest: body}); continue; }
    if (!body || !body.length) { rows.push({cells: [r.rank, hb(r.bytes)], rest: 'no outcomes'}); continue; }
    body.forEach((o, j) => {
      const lead = j ? ['', ''] : [r.rank, hb(r.bytes)];
      if (Array.isArray(o)) rows.push({cells: lead.concat([0, 1, 2, 3, 4].map((c) => vt(o[c])))});
      else rows.push({cells: lead, rest: vt(o)});
    });
  }
  if (!rows.length) { add(P, 'div', 'sub', 'results: none in the log'); return; }
  table(P, ['rank', 'bytes', 'request', 'start', 'ran', 'accepted', 'writes'], rows,
    new Set([0, 1, 3, 4, 5]));
}
const ARRIVAL_BAR = 120;                // px: the bar of the last arrival
function arrivalTable(x) {
  // each rank's result as it came to the join, in rank order: a bar from 0 to how far behind the
  // first it came, the last one (the one the join waited for) marked
  const A = x.arrivals;
  if (!A || !A.rows.length) return;
  add(P, 'div', 'sub', 'arrivals at the join' + (A.last >= 0 ? ': it waited ' + ft(A.most) +
    ' for rank ' + A.last : ''));
  const t = add(P, 'table', 'arrivals');
  const hr = add(add(t, 'thead'), 'tr');
  [['rank', 'n'], ['after', 'n'], ['behind first', 'n'], ['exec', 'n'], ['', ''], ['', '']].forEach(
    (h) => add(hr, 'th', h[1], h[0]));
  const body = add(t, 'tbody');
  for (const r of A.rows.slice().sort((p, q) => p.rank - q.rank)) {
    const last = r.rank === A.last;
    const tr = add(body, 'tr', last ? 'last' : '');
    [r.rank, ft(r.after), ft(r.behind), r.exec >= 0 ? ft(r.exec) : '-'].forEach((v) => add(tr, 'td', 'n', v));
    const bar = add(add(tr, 'td', ''), 'span', 'abar');
    bar.style.width = (A.most > 0 ? Math.round(ARRIVAL_BAR * r.behind / A.most) : 0) + 'px';
    add(tr, 'td', '', last ? 'last' : '');
  }
}
function eventLine(m) {
  const d = add(P, 'div', 'ev ' + (m.kind === 'lost' || m.kind.indexOf('fail') >= 0 ? 'bad'
    : m.kind === 'link' || m.kind === 'partition' ? 'link' : ''), '');
  const bang = m.kind === 'lost' || m.kind === 'step-failed' || m.kind === 'link' || m.kind === 'partition'
    ? '! ' : '';
  d.textContent = bang + m.text + '  (' + at(m.t) + ')';
}
function showStep(k) {
  selStep = k; selReq = null;
  P.replaceChildren();
  P.dataset.step = String(k);
  add(P, 'h2', '', 'step ' + k);
  const i = stepIdx.get(k);
  if (i !== undefined) {
    add(P, 'div', 'line mono', ST.line[i] || '(nothing happened)');
    add(P, 'div', 'sub', 'committed in epoch ' + ST.epoch[i] + ': ' + at(stepA[i]) + ' to ' + at(stepB[i]) +
      ' (' + ft(stepB[i] - stepA[i]) + ')');
    const names = Object.keys(C);
    if (names.length) {
      const rows = [];
      for (let j = 0; j < names.length; j += 2) {
        const cell = (n) => (n ? [n.replace(/_/g, ' '), vt(C[n][i])] : ['', '']);
        rows.push({cells: cell(names[j]).concat(cell(names[j + 1]))});
      }
      table(P, ['counter', '', 'counter', ''], rows, new Set([1, 3]));
    }
  }
  const quiet = idleOf(k);
  if (quiet) {
    add(P, 'div', 'sub', 'idle: steps ' + quiet[0] + '-' + quiet[1] + ', empty plans answered by the ' +
      'scheduler: no round trip');
  }
  const list = attemptsOf.get(k) || [];
  const atStep = marksOfStep.get(k) || [];
  const shown = new Set();
  for (const x of list) {
    const plan = x.plan >= 0 ? (D.plans || [])[x.plan] : null;
    const n = Array.isArray(plan) ? plan.length : '?';
    add(P, 'h3', '', 'step ' + k + ', epoch ' + x.epoch + ': plan of ' + n + ' item' + (n === 1 ? '' : 's') +
      ', ' + hb(x.planBytes) + ' to ' + ranksText(x.rts.map((r) => r.rank).sort((p, q) => p - q)));
    arrivalTable(x);
    if (plan === null || plan === undefined) {
      add(P, 'div', 'sub', 'plan not kept (the page bounds its size): inferris-dist inspect WIRELOG --step ' +
        k + ' prints it');
    } else if (typeof plan === 'string') add(P, 'div', 'mono', plan);
    else planTable(plan);
    resultTables(x);
    add(P, 'div', 'join ' + (x.ok ? 'ok' : x.void || x.inFlight ? 'void' : 'bad'), 'join: ' + x.verdict +
      (x.void ? ' \u2014 not a failure: a plan sent ahead is void when its epoch ends before it is read' : ''));
    for (const m of atStep) {
      if (m.epoch === x.epoch && !shown.has(m.i)) { shown.add(m.i); eventLine(m); }
    }
  }
  const rest = atStep.filter((m) => !shown.has(m.i));
  if (rest.length) {
    add(P, 'h3', '', 'events at step ' + k);
    rest.forEach(eventLine);
  }
  if (!list.length && i === undefined && !quiet) {
    add(P, 'div', 'sub', 'no step ' + k + ' in the log');
  }
  add(P, 'div', 'sub', 'the same as `inferris-dist inspect WIRELOG --step ' + k + '` prints');
  dirty();
}
function showRequest(i) {
  selReq = i; selStep = null;
  P.replaceChildren();
  delete P.dataset.step;
  const lines = requestLines(i);
  add(P, 'h2', '', lines[0]);
  lines.slice(1).forEach((l) => add(P, 'div', '', l));
  const q = REQ[i];
  const rows = [];
  for (let k = 0; q && k < q.n && rows.length < 400; k++) {
    rows.push({cells: [STATES[q.s[k]] || '?', at(q.t[k]), ft(q.t[k + 1] - q.t[k])]});
  }
  if (q && q.n > rows.length) rows.push({cells: ['...', '', ''], rest: (q.n - rows.length) + ' more'});
  table(P, ['state', 'from', 'for'], rows, new Set([1, 2]));
  if (RQ.info[i] && RQ.info[i][5]) {
    add(P, 'div', 'sub', 'this lane changed state more often than the page\'s budget for lanes allows: it ' +
      'is kept at ' + RQ.info[i][5] + '-step resolution, a stretch in which it changed state being one ' +
      '"changing" segment');
  }
  dirty();
}
function showMark(m) {
  P.replaceChildren();
  delete P.dataset.step;
  add(P, 'h2', '', m.kind);
  markLines(m).forEach((l) => add(P, 'div', '', l));
  if (m.ranks.length) add(P, 'div', 'sub', ranksText(m.ranks));
  if (m.step >= 0) {
    const b = add(P, 'button', '', 'show step ' + m.step);
    b.type = 'button';
    b.addEventListener('click', () => showStep(m.step));
  }
}
function showRun() {
  P.replaceChildren();
  add(P, 'h2', '', 'the run');
  const M = D.meta || {};
  const rows = [];
  const put = (k, v) => {
    if (v !== '' && v !== null && v !== undefined) rows.push({cells: [k, String(v)]});
  };
  put('workload', M.name);
  const changed = worldChanges.length;
  put('world size', changed ? worldAsked + ' asked, ' + worldNow + (M.status ? ' at the end' : ' now') +
    ' (changed ' + changed + ' time' + (changed === 1 ? '' : 's') + ')' : M.world_size);
  put('rung', M.rung);
  put('on rank loss', M.policy);
  put('faults', (M.faults || []).join(' '));
  for (const k of Object.keys(M.config || {})) put(k.replace(/_/g, ' '), vt(M.config[k]));
  put('requests', M.requests);
  put('scheduler pid', M.scheduler_pid);
  put('address', M.address);
  put('clocks', M.shared_clock === true ? 'one host: one monotonic clock'
    : M.shared_clock === false ? 'ranks elsewhere: each placed by its fastest round trip' : '');
  put('status', M.status);
  put('error', M.error);
  put('messages', M.messages + ' (' + hb(M.bytes_out) + ' out, ' + hb(M.bytes_in) + ' in)');
  put('steps', nSteps + ' committed, ' + attempts.length + ' attempts (' + failed.length + ' failed' +
    (voided.length ? ', ' + voided.length + ' void: sent ahead, never read' : '') +
    (inFlight.length ? ', ' + inFlight.length + ' in flight' : '') + ')');
  for (const o of M.offsets || []) put('clock of rank ' + o[0] + ' (pid ' + o[1] + ')', o[2] + ' \u00b5s');
  table(P, ['', ''], rows, new Set()).className = 'wrap';
  const resizes = marks.filter((m) => m.kind === 'resize');
  if (resizes.length) {
    add(P, 'h3', '', 'the world\'s size changed');
    for (const m of resizes.slice(0, 64)) {
      const d = add(P, 'div', 'ev', 'step ' + m.step + ': ' + m.text + '  (' + at(m.t) + ')');
      d.title = 'click: step ' + m.step;
      d.addEventListener('click', () => { showStep(m.step); reveal(m.step); });
    }
    if (resizes.length > 64) add(P, 'div', 'sub', (resizes.length - 64) + ' more');
  }
  add(P, 'div', 'sub', 'Click a step (the top lane, a round trip or a phase) for its plan item by item, ' +
    'every rank\'s result and the join; a request\'s lane for its story; a mark for what happened.');
}

// -- the world's size over the steps -------------------------------------------------------------
// A small step chart under the run's line, drawn only when the size changed: x the steps, y the
// ranks, the size asked for as a dashed line, each change a dot (hover: what changed; click: its
// step). At most one vertical and one dot a pixel column, whatever the number of changes.
function worldWords(c) {
  return 'step ' + c[0] + ': ' + (txt(c[4]) || 'resize') + ', world size ' + c[1] + ' \u2192 ' + c[2] +
    (Number.isInteger(c[5]) ? ' in epoch ' + c[5] : '');
}
function worldChart() {
  const box = $('world');
  if (!box) return;
  box.replaceChildren();
  box.hidden = !worldChanges.length;
  if (!worldChanges.length) return;
  const w = 320, h = 56, x0 = 22, x1 = w - 50, y0 = 6, y1 = h - 14;
  const n = worldChanges.length;
  const lastStep = Math.max(1, worldChanges[n - 1][0] + 1,
    stepList.length ? stepList[stepList.length - 1] : 0);
  let top = Math.max(1, worldAsked), low = worldChanges[0][1];
  for (const c of worldChanges) { top = Math.max(top, c[1], c[2]); low = Math.min(low, c[1], c[2]); }
  const floor = Math.max(0, low - 1);         // the smallest size a step above the bottom
  const px = (k) => Math.round(x0 + (x1 - x0) * Math.max(0, Math.min(k, lastStep)) / lastStep) + 0.5;
  const py = (r) => Math.round(y1 - (y1 - y0) * (Math.max(floor, r) - floor) / (top - floor || 1)) + 0.5;
  const sizes = [worldChanges[0][1]].concat(worldChanges.slice(0, 12).map((c) => c[2] + ' (step ' + c[0] +
    ')'));
  const said = 'world size over the steps: ' + sizes.join(' \u2192 ') + (n > 12 ? ' \u2192 \u2026 ' +
    (n - 12) + ' more' : '') + '; asked for ' + worldAsked + ', ' + worldNow +
    (D.meta && D.meta.status ? ' at the end' : ' now');
  const c2 = add(box, 'canvas', 'wchart');
  c2.setAttribute('role', 'img');
  c2.setAttribute('aria-label', said);
  const ratio = window.devicePixelRatio || 1;
  c2.width = Math.round(w * ratio);
  c2.height = Math.round(h * ratio);
  c2.style.width = w + 'px';
  c2.style.height = h + 'px';
  const g = c2.getContext('2d');
  g.setTransform(ratio, 0, 0, ratio, 0, 0);
  g.font = '10px system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif';
  g.textBaseline = 'middle';
  // the line: a level, then at each pixel column holding changes, a vertical through them all
  let level = worldChanges[0][1], col = null, lo = level, hi = level;
  const pts = [[x0, py(level)]];
  const dots = [];
  const up = () => { pts.push([col, py(lo)], [col, py(hi)], [col, py(level)]); };
  for (const c of worldChanges) {
    const x = px(c[0]);
    if (x !== col) {
      if (col !== null) up();
      pts.push([x, py(level)]);
      col = x; lo = hi = level;
      dots.push(c);
    }
    lo = Math.min(lo, c[1], c[2]); hi = Math.max(hi, c[1], c[2]);
    level = c[2];
  }
  up();
  pts.push([x1, py(level)]);
  const trace = () => {
    g.beginPath();
    g.moveTo(pts[0][0], pts[0][1]);
    for (const q of pts) g.lineTo(q[0], q[1]);
  };
  trace();
  g.lineTo(x1, y1); g.lineTo(x0, y1); g.closePath();
  g.fillStyle = '#e3eaf5'; g.fill();
  g.fillStyle = '#b3bcc8'; g.fillRect(x0, y1, x1 - x0, 1);
  g.strokeStyle = '#3b5b92'; g.lineWidth = 1.5;
  trace(); g.stroke();
  const asked = py(worldAsked);
  g.strokeStyle = COL.restart; g.lineWidth = 1; g.setLineDash([3, 2]);
  g.beginPath(); g.moveTo(x0, asked); g.lineTo(x1, asked); g.stroke();
  g.setLineDash([]);
  g.fillStyle = '#b35900'; g.textAlign = 'left';
  g.fillText('asked ' + worldAsked, x1 + 4, asked);
  g.fillStyle = '#445'; g.textAlign = 'right';
  for (const r of top === low ? [top] : [top, low]) g.fillText(String(r), x0 - 4, py(r));
  g.fillStyle = '#667'; g.textAlign = 'left';
  g.fillText('step 0', x0, h - 5);
  g.textAlign = 'right';
  g.fillText(String(lastStep), x1, h - 5);
  for (const c of dots) {
    g.fillStyle = c[2] < c[1] ? COL.lost : c[2] > c[1] ? COL.grow : COL.resize;
    g.beginPath(); g.arc(px(c[0]), py(c[2]), 3, 0, 6.3); g.fill();
  }
  const dotAt = (e) => {                // the change whose dot is nearest the pointer (within 6 px)
    const r = c2.getBoundingClientRect();
    const x = e.clientX - r.left, y = e.clientY - r.top;
    let best = null, bd = 36;
    for (const c of dots) {
      const d = (px(c[0]) - x) ** 2 + (py(c[2]) - y) ** 2;
      if (d <= bd) { best = c; bd = d; }
    }
    return best;
  };
  c2.addEventListener('mousemove', (e) => {
    const c = dotAt(e);
    c2.style.cursor = c ? 'pointer' : '';
    showTip(c ? {lines: [worldWords(c)].concat(resizeText(c))} : {lines: [said]}, e.clientX, e.clientY);
  });
  c2.addEventListener('mouseleave', () => { tip.style.display = 'none'; });
  c2.addEventListener('click', (e) => {
    const c = dotAt(e);
    if (c) { showStep(c[0]); reveal(c[0]); }
  });
  add(box, 'span', 'wcap', said);
}
function resizeText(c) {                // what the resize's mark says, if it was kept
  const m = (marksOfStep.get(c[0]) || []).find((x) => x.kind === 'resize' && x.epoch === c[5]);
  return m ? [m.text] : [];
}

// -- the header ------------------------------------------------------------------------------
function header() {
  const M = D.meta || {};
  document.title = D.title || document.title;
  $('title').textContent = D.title || '';
  const run = $('run');
  const parts = [];
  if (M.name) parts.push(M.name);
  parts.push(ranks.length + ' rank' + (ranks.length === 1 ? '' : 's'));
  if (M.rung) parts.push('rung ' + M.rung);
  if (M.policy) parts.push('on rank loss: ' + M.policy);
  if (M.faults && M.faults.length) parts.push('faults ' + M.faults.join(' '));
  if (M.requests !== null && M.requests !== undefined) parts.push(M.requests + ' requests');
  const open = [failed.length ? failed.length + ' failed' : '', inFlight.length ? inFlight.length + ' in flight' : '']
    .filter((w) => w);
  parts.push(nSteps + ' steps committed in ' + attempts.length + ' attempts' +
    (open.length ? ' (' + open.join(', ') + ')' : ''));
  const lost = markCount.lost || 0, restarts = markCount.restart || 0, resized = worldChanges.length;
  if (lost || restarts || resized) {
    parts.push(lost + ' loss' + (lost === 1 ? '' : 'es') + ', ' + restarts + ' restart' +
      (restarts === 1 ? '' : 's') + (resized ? ', ' + resized + ' resize' + (resized === 1 ? '' : 's') : ''));
  }
  const linked = markCount.link || 0, cuts = markCount.partition || 0;
  if (linked || cuts) parts.push('the link acted on ' + linked + ' message' + (linked === 1 ? '' : 's') +
    (cuts ? ', cut ' + cuts + ' time' + (cuts === 1 ? '' : 's') : ''));
  add(run, 'span', '', parts.join(' \u00b7 '));
  if (M.status) {
    add(run, 'span', '', ' \u00b7 ');
    const said = 'status ' + M.status + (M.error ? ': ' + M.error : '');
    add(run, 'span', M.status === 'ok' ? 'ok' : 'bad', said);
  }
  const notes = $('notes');
  for (const n of D.notes || []) add(notes, 'div', 'note', n);
  const lg = $('legend');
  const items = [['prepare', COL.prepare], ['execute', COL.execute], ['commit', COL.commit],
    ['recover', COL.recover], ['round trip', COL.rt], ['failed', COL.rtFail], ['rank decode', COL.decode],
    ['rank execute', COL.exec], ['rank encode', COL.encode], ['audit', COL.audit], ['join', COL.hand],
    ['rejoin wait', COL.wait], ['lost', COL.lost], ['restart', COL.restart], ['link, cut off', COL.link],
    ['waiting', COL.waiting],
    ['running', COL.running], ['preempted', COL.preempted]];
  if (voided.length) items.splice(6, 0, ['void (sent ahead)', COL.rtVoid]);
  if (arrived) items.splice(items.findIndex((it) => it[0] === 'failed') + 1, 0, ['last to arrive', COL.last]);
  if (worldChanges.length) items.splice(items.findIndex((it) => it[0] === 'restart') + 1, 0,
    ['resize', COL.resize]);
  if (RQ.coarse) {
    items.push(['changing (kept coarser)', 'repeating-linear-gradient(135deg, ' + COL.running + ' 0 2px, ' +
      COL.waiting + ' 2px 5px)']);
  }
  for (const it of items) {
    const sw = add(lg, 'span', 'sw', '');
    sw.style.background = it[1];
    add(lg, 'span', '', it[0]);
  }
}

// -- input -----------------------------------------------------------------------------------
const tip = $('tip');
let drag = null;
function showTip(h, cx, cy) {
  if (!h || !h.lines || !h.lines.length) { tip.style.display = 'none'; return; }
  tip.replaceChildren();
  h.lines.forEach((l, j) => add(tip, j ? 'div' : 'b', '', l));
  tip.style.display = 'block';
  const r = tip.getBoundingClientRect();
  let x = cx + 14, y = cy + 14;
  if (x + r.width > window.innerWidth - 4) x = Math.max(4, cx - r.width - 10);
  if (y + r.height > window.innerHeight - 4) y = Math.max(4, cy - r.height - 10);
  tip.style.left = x + 'px';
  tip.style.top = y + 'px';
}
function local(e) {
  const r = cv.getBoundingClientRect();
  return [e.clientX - r.left, e.clientY - r.top];
}
cv.addEventListener('wheel', (e) => {
  e.preventDefault();
  const p = local(e);
  const dy = e.deltaMode === 1 ? e.deltaY * 16 : e.deltaY;
  const dx = e.deltaMode === 1 ? e.deltaX * 16 : e.deltaX;
  if (e.shiftKey || p[0] < GX) { sy += dy || dx; clampY(); dirty(); } else if (Math.abs(dx) > Math.abs(dy)) {
    pan(dx);
  } else zoom(Math.exp(dy * 0.002), p[0]);
}, {passive: false});
cv.addEventListener('mousedown', (e) => {
  if (e.button !== 0) return;
  const p = local(e);
  drag = {x: p[0], y: p[1], v0: v0, v1: v1, sy: sy, moved: false};
  cv.classList.add('dragging');
});
window.addEventListener('mousemove', (e) => {
  const p = local(e);
  if (drag) {
    const dx = p[0] - drag.x, dy = p[1] - drag.y;
    if (Math.abs(dx) + Math.abs(dy) > 3) drag.moved = true;
    if (drag.moved) {
      const d = dx * (drag.v1 - drag.v0) / (W - GX);
      v0 = drag.v0 - d; v1 = drag.v1 - d; clampX();
      sy = drag.sy - dy; clampY();
      tip.style.display = 'none';
      dirty();
    }
    return;
  }
  if (e.target !== cv) { tip.style.display = 'none'; return; }
  showTip(hit(p[0], p[1]), e.clientX, e.clientY);
});
window.addEventListener('mouseup', (e) => {
  if (!drag) return;
  const d = drag;
  drag = null;
  cv.classList.remove('dragging');
  if (d.moved) return;
  const p = local(e);
  click(p[0], p[1]);
});
cv.addEventListener('mouseleave', () => { if (!drag) tip.style.display = 'none'; });
function click(x, y) {
  const h = hit(x, y);
  if (!h) return;
  if (h.step !== undefined && h.step !== null) showStep(h.step);
  else if (h.req !== undefined) showRequest(h.req);
  else if (h.mark) showMark(h.mark);
}
function stepBy(d) {
  if (!stepList.length) return;
  let j;
  if (selStep === null) j = d > 0 ? 0 : stepList.length - 1;
  else {
    const i = lowerBound(stepList, selStep);
    j = stepList[i] === selStep ? i + d : d > 0 ? i : i - 1;
  }
  j = Math.max(0, Math.min(stepList.length - 1, j));
  showStep(stepList[j]);
  reveal(stepList[j]);
}
function reveal(k) {
  const s = stepSpan(k);
  if (!s) return;
  if (s[0] < v0 || s[1] > v1) {
    const w = Math.max(v1 - v0, (s[1] - s[0]) * 1.2);
    const c = (s[0] + s[1]) / 2;
    v0 = c - w / 2; v1 = c + w / 2; clampX(); dirty();
  }
}
function focusStep(k) {
  const s = stepSpan(k);
  if (!s) return false;
  const w = Math.max(20, (s[1] - s[0]) * 6);
  const c = (s[0] + s[1]) / 2;
  v0 = c - w / 2; v1 = c + w / 2; clampX(); draw();
  return true;
}
$('zin').addEventListener('click', () => zoom(0.5));
$('zout').addEventListener('click', () => zoom(2));
$('fit').addEventListener('click', fit);
$('prev').addEventListener('click', () => stepBy(-1));
$('next').addEventListener('click', () => stepBy(1));
$('goto').addEventListener('keydown', (e) => {
  if (e.key !== 'Enter') return;
  const k = parseInt(e.target.value, 10);
  if (Number.isInteger(k)) { showStep(k); reveal(k); }
});
document.addEventListener('keydown', (e) => {
  if (e.target && e.target.tagName === 'INPUT') return;
  const k = e.key;
  if (k === '+' || k === '=' || k === 'w') zoom(0.7);
  else if (k === '-' || k === 's') zoom(1 / 0.7);
  else if (k === '0' || k === 'f') fit();
  else if (k === 'ArrowLeft' || k === 'a') pan(-80);
  else if (k === 'ArrowRight' || k === 'd') pan(80);
  else if (k === 'ArrowUp' || k === 'ArrowDown') { sy += k === 'ArrowUp' ? -40 : 40; clampY(); dirty(); }
  else if (k === '[') stepBy(-1);
  else if (k === ']') stepBy(1);
  else return;
  e.preventDefault();
});
if (window.ResizeObserver) new ResizeObserver(resize).observe(plot);
window.addEventListener('resize', resize);

// -- links: PAGE#step=K opens step K, PAGE#t=A-B shows seconds A to B of the run (since its
// start, as the axis counts them), and both may be given (#step=K&t=A-B). Once the page is up,
// the address follows what is shown, so that it is a link to it.
const NUM = '(-?(?:\\d{1,12}(?:\\.\\d{0,9})?|\\.\\d{1,9}))';   // signed: a view may begin before the run
const RANGE = new RegExp('^' + NUM + '-' + NUM + '$');
function parseLink(hash) {
  const out = {};
  for (const part of String(hash).replace(/^#/, '').split('&')) {
    const eq = part.indexOf('=');
    const key = part.slice(0, eq), value = part.slice(eq + 1);
    if (key === 'step' && /^\d{1,15}$/.test(value)) out.step = parseInt(value, 10);
    const r = key === 't' ? RANGE.exec(value) : null;
    if (r && parseFloat(r[2]) > parseFloat(r[1])) out.t = [parseFloat(r[1]) * 1e6, parseFloat(r[2]) * 1e6];
  }
  return out;
}
let linkOn = false, linkTimer = 0, linkFirst = '';
function linkOf() {
  const w = Math.max(1e-6, (v1 - v0) / 1e6);
  const d = Math.max(0, Math.min(6, Math.ceil(-Math.log10(w)) + 3));
  const t = 't=' + (v0 / 1e6).toFixed(d) + '-' + (v1 / 1e6).toFixed(d);
  return '#' + (selStep !== null ? 'step=' + selStep + '&' : '') + t;
}
function linkTo() {                     // the address, once what is shown has settled
  if (!linkOn) return;
  clearTimeout(linkTimer);
  linkTimer = setTimeout(() => {
    const hash = linkOf();
    if (hash === location.hash || (!location.hash && hash === linkFirst)) return;
    try {
      history.replaceState(history.state, '', hash);
    } catch (err) {
      linkOn = false;                   // a page that may not rewrite its own address: left as it is
    }
  }, 300);
}
function applyLink() {
  const l = parseLink(location.hash);
  if (l.step !== undefined) {
    showStep(l.step);
    if (!l.t) focusStep(l.step);
  }
  if (l.t) { v0 = l.t[0]; v1 = l.t[1]; clampX(); }
  draw();
  return l;
}
window.addEventListener('hashchange', applyLink);

// -- what a test (or a curious engineer) may read ----------------------------------------------
function stepPoint(k) {
  const s = stepSpan(k);
  const L = LANES[0];
  if (!s) return null;
  // With overlap scheduling the next step's plan goes out before this one commits: a point
  // over both is the later step's (the latest to start), so aim before the next one starts.
  const after = stepList[stepList.indexOf(k) + 1];
  const next = after === undefined ? null : stepSpan(after);
  const end = next && next[0] > s[0] ? Math.min(s[1], next[0]) : s[1];
  const a = Math.max(X(s[0]), GX), b = Math.min(X(end), W);
  if (b < a) return null;
  const r = cv.getBoundingClientRect();
  const i = stepIdx.get(k);
  // A committed step's band, below its marks (a loss, a restart: hit first in the top 14 px)
  // and above its failed attempts (the lower half): a point that is the step and nothing else.
  const yy = L.y - sy + AX + (i !== undefined ? 14 : L.h - 8);
  return {x: r.left + (a + b) / 2, y: r.top + yy};
}
window.inferrisPage = Object.freeze({
  version: 1,
  ranks: ranks.slice(),
  rankLanes: R.length,
  steps: nSteps,
  stepNumbers: stepList.slice(),
  attempts: attempts.length,
  failedAttempts: failed.length,
  attemptsInFlight: inFlight.length,
  arrivals: arrived,
  marks: Object.freeze(Object.assign({}, markCount)),
  requestLanes: RQ.ids.length,
  requests: RQ.total,
  counterTracks: TRACKS.map((t) => t.label),
  lanes: () => LANES.map((L) => ({kind: L.kind, label: L.label, y: L.y, h: L.h})),
  notes: (D.notes || []).slice(),
  get drawn() { return JSON.parse(JSON.stringify(stats)); },
  get frames() { return frames; },
  get selected() { return selStep; },
  get view() { return [v0, v1, sy]; },
  voidAttempts: voided.length,
  world: Object.freeze({requested: worldAsked, effective: worldNow, changes: worldChanges.length}),
  fitSpan: fitSpan.slice(),
  stepPoint: stepPoint,
  focusStep: focusStep,
  fit: () => { fit(); draw(); },
  setView: (a, b, y) => { v0 = a; v1 = b; if (y !== undefined) { sy = y; clampY(); } clampX(); draw(); },
  scrollTo: (y) => { sy = y; clampY(); draw(); },
  select: (k) => showStep(k),
  parseLink: parseLink,
});

header();
worldChart();
showRun();
fit();
resize();
if (given === undefined) applyLink();   // a live page drawn again with news keeps its own view
linkFirst = linkOf();
linkOn = true;
document.body.dataset.ready = '1';
if (window.inferrisLive) window.inferrisLive.rendered(page);   // served live: draw again with news
})();
