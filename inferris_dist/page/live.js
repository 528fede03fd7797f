// inferris-dist: the live page's script, put before the page's own (page.js) in pages served
// while their run goes on (`launch --serve`, `inferris-dist serve WIRELOG`). It listens to the
// server's event stream (/events, the only connection the page's policy allows: 'self'), and
// each time the run's state comes it says where the run is above the page and draws the page
// again with the new data, keeping the view (unless it showed the whole run: then it follows)
// and the step shown. When the run has ended it says so, closes the stream and keeps what it
// shows. page.js hands its drawing function over once (window.inferrisLive.rendered); every
// listener, observer and frame a drawing asked for is dropped before the next one draws.
(function () {
'use strict';
const realAdd = EventTarget.prototype.addEventListener;
const realFrame = window.requestAnimationFrame.bind(window);
const realCancel = window.cancelAnimationFrame.bind(window);
let drawing = new AbortController();   // the current drawing's listeners
let frames = new Set();
let observers = [];
EventTarget.prototype.addEventListener = function (type, fn, options) {
  const o = options !== null && typeof options === 'object' ? Object.assign({}, options)
    : {capture: !!options};
  if (!o.signal) o.signal = drawing.signal;
  return realAdd.call(this, type, fn, o);
};
window.requestAnimationFrame = function (fn) {
  const id = realFrame((t) => { frames.delete(id); fn(t); });
  frames.add(id);
  return id;
};
if (window.ResizeObserver) {
  const RealObserver = window.ResizeObserver;
  window.ResizeObserver = class extends RealObserver {
    constructor(fn) { super(fn); observers.push(this); }
  };
}

let draw = null;          // page.js's drawing function
let lastFit = null;       // the view right after the last drawing: the whole run
let shownVersion = -1;
let pending = null;       // the latest news not drawn yet (raw text)
let source = null;
let failures = 0;
const state = {renders: 0, messages: 0, ended: false, health: '', step: null, version: -1,
  closed: false};

const $ = (id) => document.getElementById(id);
function banner() {
  let b = $('live');
  if (!b) {
    b = document.createElement('div');
    b.id = 'live';
    b.className = 'note';
    const h = $('title');
    h.parentNode.insertBefore(b, h.nextSibling);
  }
  return b;
}
function say(parts, cls) {
  const b = banner();
  b.replaceChildren();
  for (const p of parts) {
    if (p && p.href) {
      const a = document.createElement('a');
      a.href = p.href;
      a.textContent = p.text;
      a.setAttribute('download', '');
      b.appendChild(a);
    } else {
      const s = document.createElement('span');
      s.textContent = String(p);
      b.appendChild(s);
    }
  }
  b.className = 'note' + (cls ? ' ' + cls : '');
}
function plural(n, one, many) { return n + ' ' + (n === 1 ? one : many || one + 's'); }

function tell(live) {
  const where = (live.step === null ? 'no step committed yet' : 'step ' + live.step) +
    ' \u00b7 epoch ' + live.epoch + ' \u00b7 ' + plural(live.steps, 'step') + ' committed' +
    (live.losses ? ' \u00b7 ' + plural(live.losses, 'loss', 'losses') : '') +
    (live.restarts ? ' \u00b7 ' + plural(live.restarts, 'restart') : '') +
    (live.world && live.world.effective && live.world.effective !== live.world.requested
      ? ' \u00b7 world size ' + live.world.effective + ' of ' + live.world.requested + ' asked' : '');
  if (live.ended) {
    const how = live.status === 'ok' ? 'the run ended (ok)' : 'the run failed' +
      (live.error ? ': ' + live.error : '');
    say([how + ' \u00b7 ' + where + ' \u00b7 this page keeps what it shows; the page as --html writes it: ',
      {href: '/page.html', text: 'page.html'}], live.status === 'ok' ? 'ok' : 'bad');
  } else if (live.health === 'recovering' || live.health === 'unknown') {
    say(['live \u00b7 ' + live.health + ': ' + live.reason + ' \u00b7 ' + where], 'bad');
  } else {
    say(['live \u00b7 ' + (live.health === 'starting' ? 'starting \u00b7 ' : '') + where]);
  }
}

function redraw(data) {
  const P = window.inferrisPage;
  const view = P ? P.view : null;
  const following = !lastFit || !view || (view[0] === lastFit[0] && view[1] === lastFit[1]);
  const selected = P ? P.selected : null;
  drawing.abort();
  for (const o of observers) o.disconnect();
  observers = [];
  for (const id of frames) realCancel(id);
  frames.clear();
  drawing = new AbortController();
  for (const id of ['run', 'notes', 'legend', 'lanes', 'detail']) {
    const e = $(id);
    if (e) e.replaceChildren();
  }
  draw(data);
  const Q = window.inferrisPage;
  lastFit = Q.view;
  if (!following && view) Q.setView(view[0], view[1], view[2]);
  else if (view) Q.setView(Q.view[0], Q.view[1], view[2]);
  if (selected !== null && selected !== undefined) Q.select(selected);
  state.renders += 1;
}

function take() {
  const text = pending;
  pending = null;
  if (text === null) return;
  let news;
  try {
    news = JSON.parse(text);
  } catch (err) {
    return;
  }
  const live = news.live || {};
  state.health = live.health;
  state.step = live.step;
  state.version = live.version;
  if (news.page && live.version !== shownVersion && draw) {
    redraw(news.page);
    shownVersion = live.version;
  }
  tell(live);
  if (live.ended) {
    state.ended = true;
    if (source) { source.close(); state.closed = true; }
  }
}

function listen() {
  source = new EventSource('/events');
  realAdd.call(source, 'state', (e) => {
    failures = 0;
    state.messages += 1;
    const first = pending === null;
    pending = e.data;
    if (first) setTimeout(take, 0);
  });
  realAdd.call(source, 'error', () => {
    if (state.ended) return;
    failures += 1;
    if (failures >= 5) {            // the server is gone: keep what is shown, stop asking
      source.close();
      state.closed = true;
      say(['the server is gone (the run may go on without it) \u00b7 this page keeps what it shows'],
        'bad');
    } else {
      say(['live \u00b7 the connection to the server broke; trying again'], 'bad');
    }
  });
}

window.inferrisLive = Object.freeze({
  rendered: (fn) => {
    if (draw) return;
    draw = fn;
    lastFit = window.inferrisPage ? window.inferrisPage.view : null;
    say(['live \u00b7 connecting to the run']);
    listen();
  },
  get state() { return Object.assign({}, state); },
});
})();
