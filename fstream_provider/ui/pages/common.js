// Helpers shared by the FStream live pages (live.html, job.html); inlined by live_routes.render.
// Every value may be missing (an older agent does not report it): formatters answer "-" then, never throw.
const FS = (() => {
  const none = v => v === null || v === undefined || v === '' || (typeof v === 'number' && !isFinite(v));
  const num = v => (none(v) || typeof v === 'object' || isNaN(Number(v))) ? null : Number(v);
  const text = v => none(v) ? '-' : (typeof v === 'object' ? JSON.stringify(v) : String(v));
  function rate(bps) {  // as model.units.format_rate
    const v = num(bps);
    if (v === null) return '-';
    for (const [u, s] of [['Gbit/s', 1e9], ['Mbit/s', 1e6], ['kbit/s', 1e3]]) if (v >= s) return (v / s).toFixed(2) + ' ' + u;
    return v.toFixed(0) + ' bit/s';
  }
  function bytes(n) {  // as model.units.format_bytes: binary (KiB, MiB, GiB, TiB) everywhere, docs/airflow/live.md
    const v = num(n);
    if (v === null) return '-';
    for (const [u, s] of [['TiB', 2 ** 40], ['GiB', 2 ** 30], ['MiB', 2 ** 20], ['KiB', 2 ** 10]]) if (v >= s) return (v / s).toFixed(2) + ' ' + u;
    return Math.floor(v) + ' B';
  }
  function dur(sec) {
    const v = num(sec);
    if (v === null) return '-';
    const a = Math.abs(v), sign = v < 0 ? '-' : '';
    if (a < 60) return sign + a.toFixed(a < 10 ? 1 : 0) + ' s';
    if (a < 3600) return sign + Math.floor(a / 60) + ' min ' + Math.floor(a % 60) + ' s';
    return sign + Math.floor(a / 3600) + ' h ' + Math.floor((a % 3600) / 60) + ' min';
  }
  const TERMINAL = ['succeeded', 'failed', 'cancelled'];  // bus.job_state.TERMINAL_STATES
  const finished = state => TERMINAL.includes(state);
  // ETA ± its error: a finished job has none ("finished"), and no "± 0.0 s" when the error rounds to nothing
  function eta(e, done) {
    if (done) return 'finished';
    if (!e || typeof e !== 'object' || num(e.s) === null) return '-';
    const lo = num(e.lo), hi = num(e.hi), pm = lo !== null && hi !== null ? dur(Math.max(0, (hi - lo) / 2)) : null;
    return dur(e.s) + (pm !== null && pm !== dur(0) ? ' ± ' + pm : '');
  }
  // An attempt, counted from 1 at the first claim: null before one (a queued job's and an idle agent's 0)
  const attempt = n => { const v = num(n); return v !== null && v > 0 ? v : null; };
  // Who holds a job: its agent; nobody before a claim ("not claimed yet"; "-" once it ended unclaimed)
  const holder = (r, done) => none(r.worker) && attempt(r.attempt) === null ? (done ? '-' : 'not claimed yet')
    : text(r.worker);
  function lag(l) {
    if (!l || typeof l !== 'object') return '-';
    const out = [];
    if (num(l.oldest_s) !== null) out.push('oldest waiting ' + dur(l.oldest_s));
    if (num(l.p50_s) !== null) out.push('p50 ' + dur(l.p50_s));
    if (num(l.p99_s) !== null) out.push('p99 ' + dur(l.p99_s));
    return out.length ? out.join(', ') : '-';
  }
  function deadline(d) {
    if (!d || typeof d !== 'object' || !d.state) return '-';
    let t = String(d.state);
    if (num(d.at) !== null) t += ' (due ' + when(d.at) + ')';
    return d.message ? t + ': ' + d.message : t;
  }
  const risky = d => !!d && typeof d === 'object' && (d.state === 'at-risk' || d.state === 'infeasible');
  function layout(r) {
    const c = r && r.clusters;
    if (c && typeof c === 'object' && !Array.isArray(c) && Object.keys(c).length > 1)
      return Object.entries(c).map(([k, v]) => k + ' ' + [v && v.cc, v && v.p, v && v.pp].map(text).join('/')).join(', ');
    if (!r || (none(r.cc) && none(r.p) && none(r.pp))) return '-';
    return [r.cc, r.p, r.pp].map(text).join('/');
  }
  // A time as Airflow's UI shows it: UTC, 24-hour, HH:MM:SS, with the date (YYYY-MM-DD) unless it is today (UTC).
  function when(ts, now) {
    const v = num(ts);
    if (v === null) return '-';
    const iso = new Date(v * 1000).toISOString();  // YYYY-MM-DDTHH:MM:SS.sssZ
    const today = new Date(num(now) === null ? Date.now() : num(now) * 1000).toISOString().slice(0, 10);
    return (iso.slice(0, 10) === today ? '' : iso.slice(0, 10) + ' ') + iso.slice(11, 19);
  }
  // How old a value is, once it is older than two of its intervals ("12 s old"); '' while it is fresh.
  function staleness(ageS, intervalS) {
    const a = num(ageS), i = num(intervalS);
    return a === null || i === null || a <= 2 * i ? '' : dur(a) + ' old';
  }
  function files(r) {
    if (!r) return '-';
    const parts = [text(r.files_done) + ' done', text(r.files_pending) + ' pending', text(r.files_failed) + ' failed'];
    return parts.join(' / ') + (none(r.files_total) ? '' : ' of ' + r.files_total);
  }
  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k.startsWith('on')) e.addEventListener(k.slice(2), v); else e.setAttribute(k, v === true ? '' : v);
    }
    for (const k of kids.flat()) if (k !== null && k !== undefined) e.append(k instanceof Node ? k : String(k));
    return e;
  }
  const SVG = 'http://www.w3.org/2000/svg';
  function svg(tag, attrs, ...kids) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) if (v !== null && v !== undefined) e.setAttribute(k, v);
    for (const k of kids.flat()) if (k !== null && k !== undefined) e.append(k instanceof Node ? k : String(k));
    return e;
  }
  function spark(points, w = 120, h = 22) {  // a throughput sparkline (bits/s, oldest first)
    const pts = (points || []).map(num).filter(v => v !== null);
    const s = svg('svg', {width: w, height: h, viewBox: `0 0 ${w} ${h}`, class: 'spark'});
    if (pts.length < 2) return s;
    const max = Math.max(...pts) || 1;
    const xy = pts.map((v, i) => `${(i * (w - 2) / (pts.length - 1) + 1).toFixed(1)},${(h - 1 - v / max * (h - 2)).toFixed(1)}`);
    s.append(svg('polyline', {points: xy.join(' '), fill: 'none', stroke: 'currentColor', 'stroke-width': 1.2}),
             svg('title', {}, 'last ' + pts.length + ' intervals, max ' + rate(max)));
    return s;
  }
  // A link to a page of Airflow's UI: the UI frames this page (sandboxed, no top navigation), so a click asks
  // the UI's router to go there (same origin: push the URL on the UI's history and tell it); elsewhere the
  // link opens normally.
  function uiLink(path, label, root) {
    const href = new URL(root + path, location.href).href;
    return el('a', {href, target: '_top', onclick: ev => {
      try {
        const top = window.top;
        if (top === window || top.location.origin !== location.origin) return;
        const st = top.history.state || {};
        top.history.pushState({usr: null, key: Math.random().toString(36).slice(2, 10), idx: (st.idx || 0) + 1}, '', href);
        top.dispatchEvent(new PopStateEvent('popstate', {state: top.history.state}));
        ev.preventDefault();
      } catch (e) { /* not the UI's frame: the link opens as links do */ }
    }}, label);
  }
  // An EventSource that comes back: the browser reconnects by itself (with Last-Event-ID) after a dropped
  // connection; after a refused one (503, a restart) a new one starts from a snapshot.
  function stream(url, on) {
    let es = null, closed = false, timer = null;
    const status = s => on.status && on.status(s);
    function open() {
      es = new EventSource(url);
      for (const [name, fn] of Object.entries(on)) {
        if (name === 'status') continue;
        es.addEventListener(name, m => { let d = null; try { d = JSON.parse(m.data); } catch (e) { /* keep null */ } fn(d, m.lastEventId); });
      }
      es.onopen = () => status('live');
      es.onerror = () => {
        if (closed) return;
        status('reconnecting');
        if (es.readyState === EventSource.CLOSED) timer = setTimeout(open, 5000);
      };
    }
    open();
    return {close() { closed = true; clearTimeout(timer); if (es) es.close(); status('closed'); }};
  }
  window.fstreamSeen = [];  // when a value reached the page (tests measure freshness with it)
  const seen = rec => window.fstreamSeen.push({...rec, at: Date.now()});
  return {none, num, text, rate, bytes, dur, finished, eta, attempt, holder, lag, deadline, risky, layout, when, staleness, files, el, svg, spark,
          uiLink, stream, seen};
})();
