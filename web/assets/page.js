// siwtun view: draws the View embedded in #siwtun-data (see package web).
// Plain JavaScript, no build step, no network access except the live
// page's own /events stream.
(function () {
  'use strict';
  const timing = { scriptStart: performance.now() };
  // The data is the View as JSON, gzip-compressed and base64-encoded: a
  // large trace then costs the HTML parser a tenth of its size.
  async function unpack(id) {
    const el = document.getElementById(id);
    if (el.dataset.encoding !== 'gzip+base64') return el.textContent;
    const text = el.textContent.trim();
    let bytes;
    if (Uint8Array.fromBase64) {
      bytes = Uint8Array.fromBase64(text);
    } else {
      const bin = atob(text);
      bytes = new Uint8Array(bin.length);
      for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    }
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream('gzip'));
    return new Response(stream).text();
  }
  // The segments' FPDUs, Markers and byte maps (one JSON line each) are
  // decoded after the page is up: the ladder does not wait for them.
  let D = null, onDetails = null;
  const failed = (err) => {
    document.getElementById('bmbody').textContent = 'cannot read the embedded data: ' + err;
    throw err;
  };
  unpack('siwtun-data').then((text) => {
    timing.decoded = performance.now();
    start(JSON.parse(text));
  }).catch(failed);
  unpack('siwtun-detail').then((text) => {
    D = text;
    timing.details = performance.now();
    document.body.dataset.details = '1';
    if (onDetails) onDetails();
  }).catch(failed);
  function start(V) {
  timing.parsed = performance.now();
  // The segments' FPDUs, Markers and byte maps are one JSON line each in
  // D, parsed when a segment is chosen (and kept).
  let lineStarts = null;
  function detail(s) {
    if (s.full || D === null) return s;
    if (!lineStarts) {
      const starts = [0];
      for (let i = D.indexOf('\n'); i >= 0; i = D.indexOf('\n', i + 1)) starts.push(i + 1);
      lineStarts = starts;
    }
    if (s.n + 1 < lineStarts.length) Object.assign(s, JSON.parse(D.slice(lineStarts[s.n], lineStarts[s.n + 1] - 1)));
    s.full = true;
    return s;
  }
  V.segs = V.segs || []; V.places = V.places || []; V.regions = V.regions || [];
  V.terms = V.terms || []; V.wcs = V.wcs || []; V.qps = V.qps || []; V.conns = V.conns || [];
  V.steps = V.steps || []; V.stats = V.stats || {}; V.addrs = V.addrs || []; V.gaps = V.gaps || [];
  const F = V.fields;
  const ROW = 22;
  const COLORS = { write: '#1f5fbf', send: '#1b7f3b', rreq: '#7b3fa0', rresp: '#0f7c86', term: '#c0162b',
    'mpa-req': '#8a5a00', 'mpa-rep': '#8a5a00', ctl: '#8c8c8c', fpdu: '#4a4a4a', other: '#6d4c41' };
  // Line patterns and widths: colour is never the only cue. Each class
  // has a pattern and width of its own, and a label is drawn on every
  // arrow; the legend (#ladlegend) shows them with the class's name.
  const DASH = { write: [], send: [10, 3], rreq: [2, 3], rresp: [], term: [6, 2, 2, 2], 'mpa-req': [1, 2],
    'mpa-rep': [4, 2], ctl: [2, 4], fpdu: [8, 4], other: [4, 4] };
  const WIDTH = { write: 2, send: 2, rreq: 2, rresp: 3, term: 3, 'mpa-req': 3, 'mpa-rep': 3, ctl: 1, fpdu: 1.5, other: 1 };
  const NAMES = { 'mpa-req': 'MPA Req', 'mpa-rep': 'MPA Rep', send: 'Send', write: 'Write', rreq: 'RdReq', rresp: 'RdResp',
    term: 'Terminate', fpdu: 'FPDU part', ctl: 'TCP control', other: 'not iWARP' };
  const state = { sel: -1, span: -1, follow: !!V.live, dirty: true };
  const $ = (id) => document.getElementById(id);
  const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;' }[c]));
  const hex = (n) => '0x' + Number(n || 0).toString(16);
  const ms = (us) => (us < 0 ? '—' : (us / 1000).toFixed(3) + ' ms');
  const link = (url, ref) => '<a href="' + esc(url) + '" target="_blank" rel="noopener">' + esc(ref) + '</a>';

  // ---- ladder -------------------------------------------------------
  const ladder = $('ladder'), canvas = $('ladcanvas'), spacer = $('spacer');
  const ctx = canvas.getContext('2d');
  function sizeLadder() {
    const dpr = window.devicePixelRatio || 1;
    const w = ladder.clientWidth, h = ladder.clientHeight;
    canvas.width = Math.max(1, w * dpr); canvas.height = Math.max(1, h * dpr);
    canvas.style.width = w + 'px'; canvas.style.height = h + 'px';
    // The canvas is sticky; the spacer gives the scroll height.
    canvas.style.marginBottom = (-h) + 'px';
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    state.dirty = true;
  }
  function marks(s) {
    const m = [];
    if (s.al === false) m.push('NOT ALIGNED');
    if (s.rx) m.push('RETX');
    if (s.ooo) m.push('OUT OF ORDER');
    if (s.drop) m.push('DROPPED');
    return m;
  }
  // The ladder's rows: the segments in time order, with a row for each
  // window of events a daemon left out (V.gaps, each before the segment
  // gap.seg) where it happened.
  // G is V.gaps by row (they arrive in the order their windows ended).
  let G = [], Gn = -1;
  function gapsByRow() {
    if (Gn !== V.gaps.length) { G = V.gaps.slice().sort((a, b) => a.seg - b.seg || a.n - b.n); Gn = V.gaps.length; }
    return G;
  }
  function gapRow(k) { return gapsByRow()[k].seg + k; }
  function gapsUpTo(i) { // the gaps before segment i
    let lo = 0, hi = gapsByRow().length;
    while (lo < hi) { const m = (lo + hi) >> 1; if (G[m].seg <= i) lo = m + 1; else hi = m; }
    return lo;
  }
  function segRow(i) { return i + gapsUpTo(i); }
  function rowItem(r) {
    let lo = 0, hi = gapsByRow().length;
    while (lo < hi) { const m = (lo + hi) >> 1; if (gapRow(m) <= r) lo = m + 1; else hi = m; }
    if (lo > 0 && gapRow(lo - 1) === r) return { gap: lo - 1 };
    return { seg: r - lo };
  }
  // first is the time of a row: when the earlier of the two ends saw it.
  function first(s) { return s.t < 0 ? s.pt : (s.pt < 0 ? s.t : Math.min(s.t, s.pt)); }
  function gapText(g) {
    return (g.t / 1000).toFixed(3) + '–' + ms(g.t2) + ' not observed: ' + g.dev + ' left out ' + g.segs + ' segments' + (g.places ? ', ' + g.places + ' placements' : '') +
      (g.wcs ? ', ' + g.wcs + ' completions' : '') + ' (the view fell behind)';
  }
  function drawGap(g, y0, w) {
    ctx.save();
    ctx.fillStyle = '#fbe3e3'; ctx.fillRect(0, y0 - 3, w, ROW);
    ctx.strokeStyle = '#a3001a'; ctx.lineWidth = 1; ctx.setLineDash([3, 3]);
    ctx.beginPath(); ctx.moveTo(0, y0 - 3); ctx.lineTo(w, y0 - 3); ctx.moveTo(0, y0 + ROW - 3); ctx.lineTo(w, y0 + ROW - 3); ctx.stroke();
    ctx.fillStyle = '#a3001a'; ctx.textAlign = 'left'; ctx.fillText(gapText(g), 4, y0 + (ROW - 6) / 2);
    ctx.restore();
  }
  function drawLadder() {
    const w = ladder.clientWidth, h = ladder.clientHeight;
    const rows = V.segs.length + V.gaps.length;
    spacer.style.height = (rows * ROW + ROW) + 'px';
    ladder.dataset.arrows = String(V.segs.length);
    ladder.dataset.gaps = String(V.gaps.length);
    ctx.clearRect(0, 0, w, h);
    const top = ladder.scrollTop;
    const first0 = Math.max(0, Math.floor(top / ROW)), last = Math.min(rows, first0 + Math.ceil(h / ROW) + 1);
    const xT = 4, xL = 118, xR = w - 16;
    ctx.strokeStyle = '#222'; ctx.lineWidth = 2; ctx.setLineDash([]);
    ctx.beginPath(); ctx.moveTo(xL, 0); ctx.lineTo(xL, h); ctx.moveTo(xR, 0); ctx.lineTo(xR, h); ctx.stroke();
    let drawn = 0;
    ctx.font = '11px system-ui, sans-serif'; ctx.textBaseline = 'middle';
    for (let r = first0; r < last; r++) {
      const it = rowItem(r);
      const y0 = r * ROW - top + 3, y1 = y0 + ROW - 6;
      if (it.gap !== undefined) { drawGap(G[it.gap], y0, w); continue; }
      const i = it.seg, s = V.segs[i];
      if (i === state.sel) { ctx.fillStyle = '#ffe9a8'; ctx.fillRect(0, y0 - 3, w, ROW); }
      ctx.fillStyle = '#555'; ctx.textAlign = 'left';
      ctx.fillText(ms(first(s)).replace(' ms', ''), xT, y0 + (ROW - 6) / 2);
      const c = COLORS[s.cls] || '#444';
      ctx.strokeStyle = c; ctx.fillStyle = c; ctx.lineWidth = WIDTH[s.cls] || 1.5; ctx.setLineDash(DASH[s.cls] || []);
      let xa = s.o ? xL : xR, xb = s.o ? xR : xL;
      if (s.drop) xb = (xa + xb) / 2;
      ctx.beginPath(); ctx.moveTo(xa, y0); ctx.lineTo(xb, y1); ctx.stroke(); ctx.setLineDash([]);
      // arrow head, or a cross where a dropped segment vanished
      if (s.drop) {
        ctx.lineWidth = 2; ctx.beginPath();
        ctx.moveTo(xb - 5, y1 - 5); ctx.lineTo(xb + 5, y1 + 5); ctx.moveTo(xb - 5, y1 + 5); ctx.lineTo(xb + 5, y1 - 5); ctx.stroke();
      } else {
        const d = s.o ? -1 : 1;
        ctx.beginPath(); ctx.moveTo(xb, y1); ctx.lineTo(xb + d * 8, y1 - 2); ctx.lineTo(xb + d * 6, y1 - 7); ctx.closePath(); ctx.fill();
      }
      if (s.al === false) { // hatched box: not FPDU-aligned
        ctx.save(); ctx.strokeStyle = '#c0162b'; ctx.lineWidth = 1;
        ctx.strokeRect(xL + 3, y0 - 2, 10, ROW - 3);
        ctx.beginPath(); ctx.moveTo(xL + 3, y1); ctx.lineTo(xL + 13, y0 - 2); ctx.stroke(); ctx.restore();
      }
      const label = s.lb + (s.len ? ' ' + s.len : '') + (marks(s).length ? ' [' + marks(s).join(', ') + ']' : '');
      const tx = (xL + xR) / 2, ty = (y0 + y1) / 2;
      const tw = ctx.measureText(label).width;
      ctx.fillStyle = 'rgba(253,253,251,0.88)'; ctx.fillRect(tx - tw / 2 - 3, ty - 7, tw + 6, 14);
      ctx.fillStyle = s.al === false || s.drop || s.cls === 'term' ? '#a3001a' : '#1b1b1b';
      ctx.textAlign = 'center'; ctx.fillText(label, tx, ty);
      drawn++;
    }
    ladder.dataset.drawn = String(drawn);
    state.dirty = false;
  }
  function renderLegend() {
    $('ladlegend').innerHTML = Object.keys(NAMES).map((c) => '<span class="key" data-cls="' + c + '" data-dash="' + DASH[c].join(' ') + '" data-width="' + WIDTH[c] + '">' +
      '<svg width="30" height="8" aria-hidden="true"><line x1="1" y1="4" x2="29" y2="4" stroke="' + COLORS[c] + '" stroke-width="' + WIDTH[c] + '" stroke-dasharray="' + (DASH[c].join(' ') || 'none') + '"/></svg>' +
      esc(NAMES[c]) + '</span>').join(' ') + ' <span class="key">' + link('https://www.rfc-editor.org/rfc/rfc5044.html#section-7.1', 'RFC 5044 §7.1 MPA frames') + ' ' +
      link('https://www.rfc-editor.org/rfc/rfc5044.html#section-4.1', '§4.1 FPDU') + ' ' + link('https://www.rfc-editor.org/rfc/rfc5040.html#section-4', 'RFC 5040 §4 messages') + '</span>';
  }
  function requestDraw() {
    if (state.raf) return;
    state.raf = requestAnimationFrame(() => { state.raf = 0; drawLadder(); });
  }
  ladder.addEventListener('scroll', requestDraw);
  ladder.addEventListener('click', (e) => {
    const r = ladder.getBoundingClientRect();
    const it = rowItem(Math.floor((e.clientY - r.top + ladder.scrollTop) / ROW));
    if (it.seg !== undefined && it.seg >= 0 && it.seg < V.segs.length) select(it.seg, false);
    ladder.focus();
  });
  window.addEventListener('resize', () => { sizeLadder(); requestDraw(); });

  // ---- selection and keyboard ----------------------------------------
  function select(i, scroll) {
    if (!V.segs.length) return;
    i = Math.max(0, Math.min(V.segs.length - 1, i));
    state.sel = i; state.span = -1;
    state.follow = V.live && i === V.segs.length - 1;
    if (scroll !== false) {
      const y = segRow(i) * ROW;
      if (y < ladder.scrollTop || y + ROW > ladder.scrollTop + ladder.clientHeight) ladder.scrollTop = y - ladder.clientHeight / 2;
    }
    const s = V.segs[i];
    $('sr').textContent = 'segment ' + i + ': ' + (s.o ? 'out ' : 'in ') + s.lb + ', ' + s.len + ' octets' + (marks(s).length ? ', ' + marks(s).join(', ') : '');
    for (let k = V.steps.length - 1; k >= 0; k--) if (V.steps[k].seg <= i) { markStep(k); break; }
    renderByteMap(); renderMemory(); requestDraw();
  }
  function flagged(s) { return s.al === false || s.rx || s.ooo || s.drop || s.cls === 'term'; }
  function seek(from, dir, pred) {
    for (let i = from + dir; i >= 0 && i < V.segs.length; i += dir) if (pred(V.segs[i])) return select(i);
  }
  ladder.addEventListener('keydown', (e) => {
    const page = Math.max(1, Math.floor(ladder.clientHeight / ROW) - 1);
    const cur = state.sel < 0 ? -1 : state.sel;
    let handled = true;
    switch (e.key) {
      case 'ArrowDown': case 'j': select(cur + 1); break;
      case 'ArrowUp': case 'k': select(cur - 1); break;
      case 'PageDown': select(cur + page); break;
      case 'PageUp': select(cur - page); break;
      case 'Home': select(0); break;
      case 'End': select(V.segs.length - 1); break;
      case 'n': seek(cur, 1, (s) => s.cls !== 'ctl'); break;
      case 'p': seek(cur, -1, (s) => s.cls !== 'ctl'); break;
      case 'f': seek(cur, 1, flagged); break;
      case 'F': seek(cur, -1, flagged); break;
      case 'Enter': { const r = document.querySelector('#bytemap tbody tr'); if (r) r.focus(); break; }
      default: handled = false;
    }
    if (handled) e.preventDefault();
  });
  document.addEventListener('keydown', (e) => {
    if (e.key === '?') { $('help').classList.toggle('show'); e.preventDefault(); }
    if (e.key === 'Escape') { $('help').classList.remove('show'); ladder.focus(); }
  });

  // ---- byte map -------------------------------------------------------
  function layerOf(sp) { return F[sp[2]].layer; }
  function spanValue(s, sp) {
    const f = sp[3] >= 0 ? s.fp[sp[3]] : null, h = f && f.hd;
    const m = sp[4] >= 0 ? s.mk[sp[4]] : null;
    switch (F[sp[2]].name) {
      case 'MPA key': return s.k === 'mpa-reply' ? 'MPA ID Rep Frame' : 'MPA ID Req Frame';
      case 'flags M C R, Rev': return s.fr || '';
      case 'PD_Length': return String(s.len - 20 > 0 ? s.map.filter((x) => x[0] >= 20 && x[2] !== sp[2]).reduce((a, x) => a + x[1], 0) : 0);
      case 'IRD/ORD, P2P RTR': { const mt = /ird (\d+) ord (\d+)/.exec(s.fr || ''); return mt ? 'IRD ' + mt[1] + ' ORD ' + mt[2] + (/p2p/i.test(s.fr) ? ' P2P' : '') : ''; }
      case 'private data': return sp[1] + ' octets';
      case 'Marker (FPDUPTR)':
        if (!m) return 'Marker (its FPDUPTR completes in another segment)';
        return 'FPDUPTR ' + m.p + ' → FPDU ' + m.f + ': ' + (m.ok ? 'ok' : 'BAD, should be ' + m.w) + '; stream offset ' + m.o + ' = ' + (m.o / 512) + ' × 512';
      case 'ULPDU_Length': return f ? String(f.u) : '';
      case 'DDP control T L DV': return h ? 'T=' + (h.t ? 1 : 0) + ' L=' + (h.l ? 1 : 0) + ' DV=1' : '';
      case 'RDMAP control RV opcode': return h ? 'RV=1 ' + h.op : '';
      case 'STag': return h ? hex(h.s) : '';
      case 'Tagged Offset': return h ? hex(h.to) : '';
      case 'Invalidate STag (reserved)': return h && /Invalidate/.test(h.op) ? '(the STag to invalidate)' : '0 (reserved)';
      case 'QN': return h ? String(h.qn || 0) : '';
      case 'MSN': return h ? String(h.msn || 0) : '';
      case 'MO': return h ? String(h.mo || 0) : '';
      case 'Read Request sink/source': case 'Terminate control': case 'copied headers': return h ? (h.d || '').trim() : '';
      case 'payload': return sp[1] + ' octets' + (h ? ' (of ' + h.p + ' in FPDU ' + f.i + ')' : '');
      case 'pad': return sp[1] + ' octets';
      case 'CRC32c': return f && f.crc ? (f.crc === 'off' ? 'not negotiated' : f.crc) : '(verdict when the FPDU ends)';
      default: return s.no || '';
    }
  }
  function spanClass(s, sp) {
    const name = F[sp[2]].name;
    let c = 'sp l-' + layerOf(sp);
    if (name === 'Marker (FPDUPTR)') c += ' f-marker';
    if (name === 'CRC32c') { c += ' f-crc'; const f = s.fp[sp[3]]; if (f && f.crc === 'bad') c += ' bad'; }
    if (name === 'pad') c += ' f-pad';
    if (sp[2] === 0) c += ' f-unk';
    return c;
  }
  function renderByteMap() {
    const box = $('bmbody');
    if (state.sel < 0) { box.innerHTML = '<p>Choose a segment in the ladder (click, or focus it and use ↑ ↓).</p>'; return; }
    const s = detail(V.segs[state.sel]);
    if (!s.full) { box.innerHTML = '<p>Reading the segments’ details…</p>'; return; }
    s.fp = s.fp || []; s.mk = s.mk || []; s.map = s.map || [];
    const mk = marks(s);
    let html = '<p class="mono" id="seghead">#' + s.n + ' ' + (s.o ? 'out ' : 'in ') + esc(V.addrs[s.a] || '') +
      ' seq ' + s.seq + ' ack ' + s.ack + ' len ' + s.len + (s.fl ? ' [' + esc(s.fl) + ']' : '') + '<br>' +
      'sent/received at ' + ms(s.t) + (s.pt >= 0 ? ', at the peer ' + ms(s.pt) : '') + '; checker: ' + esc(s.k) +
      (s.al !== undefined ? (s.al ? ', FPDU-aligned' : ', <span class="bad">NOT ALIGNED</span>') : '') +
      (mk.length ? ' <span class="bad">' + esc(mk.join(', ')) + '</span>' : '') + '</p>';
    if (s.fp.length) {
      html += '<p>FPDU stream position of its first FPDU octet: <b>' + s.so + '</b>' +
        (s.mon ? '; Markers sit every 512 octets of that stream (' + link(V.fields[6].rfc, 'RFC 5044 §4.3') + ')' : '; no Markers on this direction') + '.</p>';
    }
    if (s.ss) html += '<p class="bad">starts ' + s.ss.before + ' octets into FPDU ' + s.ss.fpdu + '</p>';
    if (s.se) html += '<p class="bad">ends ' + s.se.before + ' octets into FPDU ' + s.se.fpdu + (s.se.len ? ' of ' + s.se.len : '') + '</p>';
    if (s.nob) html += '<p class="bad" id="notobs">not observed: the ' + s.nob + ' octets before this segment were left out of the watch; the checker skipped them</p>';
    if (s.rs) html += '<p id="resync">' + esc(s.rs) + '</p>';
    if (s.no) html += '<p>note: ' + esc(s.no) + '</p>';
    html += '<div id="bar" role="group" aria-label="payload octets">';
    const n = Math.max(1, s.len);
    s.map.forEach((sp, k) => {
      const left = 100 * sp[0] / n, width = 100 * sp[1] / n;
      html += '<div class="' + spanClass(s, sp) + (k === state.span ? ' sel' : '') + '" data-k="' + k + '" style="left:' + left + '%;width:' + width + '%" title="' +
        esc(F[sp[2]].name + ' [' + sp[0] + ', ' + (sp[0] + sp[1]) + '): ' + spanValue(s, sp)) + '">' + (width > 6 ? esc(F[sp[2]].name) : '') + '</div>';
    });
    html += '<svg id="arrows" aria-hidden="true"></svg></div>';
    html += '<p class="legend"><span class="swatch l-mpa"></span>MPA <span class="swatch l-ddp"></span>DDP <span class="swatch l-rdmap"></span>RDMAP ' +
      '<span class="swatch l-ulp"></span>payload <span class="swatch f-marker"></span>Marker (arrow: FPDUPTR to its FPDU) <span class="swatch f-crc"></span>CRC <span class="swatch f-unk"></span>not analysed</p>';
    html += '<table id="bytemap"><thead><tr><th>octets</th><th>field</th><th>value</th><th>FPDU</th><th>defined in</th></tr></thead><tbody>';
    s.map.forEach((sp, k) => {
      const fi = F[sp[2]], v = spanValue(s, sp);
      const f = sp[3] >= 0 ? s.fp[sp[3]] : null;
      html += '<tr tabindex="-1" data-k="' + k + '" data-field="' + esc(fi.name) + '" data-at="' + sp[0] + '" data-len="' + sp[1] + '" data-value="' + esc(v) + '"' +
        (f ? ' data-fpdu="' + f.i + '"' : '') + (k === state.span ? ' class="sel"' : '') + '><td class="mono">' + sp[0] + '–' + (sp[0] + sp[1] - 1) + '</td><td>' +
        esc(fi.name) + '</td><td class="mono' + (/BAD|bad/.test(v) ? ' bad' : '') + '">' + esc(v) + '</td><td>' + (f ? f.i : '') + '</td><td>' + link(fi.rfc, fi.ref) + '</td></tr>';
    });
    html += '</tbody></table>';
    if (s.pl && s.pl.length) {
      html += '<p>placed: ' + s.pl.map((i) => { const p = V.places[i]; return esc(p.dev + ' ' + p.op + (p.stag ? ' STag ' + hex(p.stag) + ' offset ' + p.off : ' MSN ' + p.msn + ' MO ' + p.mo) + ', ' + p.len + ' octets' + (p.ooo ? ' (out of order)' : '') + (p.again ? ' (again, in order)' : '')); }).join('; ') + '</p>';
    }
    box.innerHTML = html;
    drawMarkerArrows(s);
    box.querySelectorAll('#bar .sp, #bytemap tbody tr').forEach((el) => el.addEventListener('click', () => { chooseSpan(+el.dataset.k); }));
  }
  function chooseSpan(k) {
    state.span = k;
    document.querySelectorAll('#bar .sp, #bytemap tbody tr').forEach((el) => el.classList.toggle('sel', +el.dataset.k === k));
    const r = document.querySelector('#bytemap tbody tr[data-k="' + k + '"]'); if (r) r.focus();
  }
  $('bmbody').addEventListener('keydown', (e) => {
    const rows = document.querySelectorAll('#bytemap tbody tr');
    if (!rows.length) return;
    let k = state.span;
    if (e.key === 'ArrowDown' || e.key === 'ArrowRight') k = Math.min(rows.length - 1, k + 1);
    else if (e.key === 'ArrowUp' || e.key === 'ArrowLeft') k = Math.max(0, k - 1);
    else if (e.key === 'Escape' || e.key === 'Backspace') { ladder.focus(); return; }
    else return;
    e.preventDefault(); chooseSpan(k);
  });
  function drawMarkerArrows(s) {
    const svg = $('arrows'), bar = $('bar');
    if (!svg || !bar) return;
    const W = bar.clientWidth, n = Math.max(1, s.len);
    let out = '<defs><marker id="ah" viewBox="0 0 8 8" refX="7" refY="4" markerWidth="7" markerHeight="7" orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#b36b00"/></marker></defs>';
    s.map.forEach((sp) => {
      if (sp[4] < 0) return;
      const m = s.mk[sp[4]];
      const x0 = W * (sp[0] + sp[1] / 2) / n;
      const target = m.a - (m.p & ~3);
      const x1 = W * Math.max(0, target) / n;
      const col = m.ok ? '#b36b00' : '#c0162b';
      out += '<path d="M' + x0 + ',32 C' + x0 + ',4 ' + x1 + ',4 ' + x1 + ',32" fill="none" stroke="' + col + '" stroke-width="2" marker-end="url(#ah)"' + (m.ok ? '' : ' stroke-dasharray="4 2"') + '/>';
      out += '<text x="' + ((x0 + x1) / 2) + '" y="10" font-size="10" text-anchor="middle" fill="' + col + '">' + (target < 0 ? '← ' : '') + m.p + (m.ok ? '' : ' BAD') + '</text>';
    });
    svg.innerHTML = out;
  }

  // ---- memory ---------------------------------------------------------
  function union(iv) {
    iv.sort((a, b) => a[0] - b[0]);
    let total = 0, end = -1, start = -1;
    for (const [a, b] of iv) {
      if (a > end) { if (end > start) total += end - start; start = a; end = b; } else if (b > end) end = b;
    }
    if (end > start) total += end - start;
    return total;
  }
  function renderMemory() {
    const box = $('membody');
    if (!V.regions.length) { box.innerHTML = '<p>No placement into a registered region yet.</p>'; return; }
    const upto = state.sel >= 0 && $('upto').checked ? state.sel : Infinity;
    const byRegion = V.regions.map(() => []);
    for (const p of V.places) {
      if (p.region < 0) continue;
      if (upto !== Infinity && (p.seg < 0 ? p.t > (V.segs[upto].t) : p.seg > upto)) continue;
      byRegion[p.region].push(p);
    }
    let html = '';
    V.regions.forEach((r, i) => {
      const ps = byRegion[i];
      const len = Math.max(1, r.len);
      const placed = union(ps.map((p) => [p.off, p.off + p.len]));
      const ooo = ps.filter((p) => p.ooo).length, again = ps.filter((p) => p.again).length;
      html += '<div class="strip" data-region="' + i + '" data-len="' + r.len + '" data-placed="' + placed + '"><div><b>' + esc(r.dev) + ' STag ' + hex(r.stag) + '</b> bounds ' +
        hex(r.addr) + '–' + hex(r.addr + r.len) + ' (' + r.len + ' octets' + (r.known ? '' : ', as far as placements reach') + ')' +
        (r.known ? ', access ' + esc(r.access) + ', PD ' + r.pd : '') + '</div><canvas width="800" height="30" aria-label="placements into STag ' + hex(r.stag) + '"></canvas>' +
        '<div class="legend">placed ' + placed + ' of ' + r.len + ' octets in ' + ps.length + ' placements: ' + (ps.length - ooo - again) + ' in order (solid), ' + ooo +
        ' out of order (hatched), ' + again + ' placed again when the gap filled (outlined) — ' + link('https://www.rfc-editor.org/rfc/rfc5041.html#section-5', 'RFC 5041 §5') + '</div></div>';
    });
    box.innerHTML = html;
    const selPlaces = new Set(state.sel >= 0 ? (V.segs[state.sel].pl || []) : []);
    box.querySelectorAll('.strip').forEach((div) => {
      const i = +div.dataset.region, r = V.regions[i], c = div.querySelector('canvas');
      const W = c.width = Math.max(200, c.clientWidth || 800), H = c.height;
      const g = c.getContext('2d'), len = Math.max(1, r.len);
      g.fillStyle = '#eeeeee'; g.fillRect(0, 0, W, H);
      const hatch = g.createPattern(hatchTile(), 'repeat');
      for (const p of byRegion[i]) {
        const x = W * p.off / len, w = Math.max(1, W * p.len / len);
        if (p.again) { g.strokeStyle = '#1b1b1b'; g.lineWidth = 1; g.strokeRect(x + 0.5, 3.5, w - 1, H - 7); continue; }
        g.fillStyle = p.ooo ? hatch : '#3c9d5a'; g.fillRect(x, 2, w, H - 4);
        if (selPlaces.has(p.n)) { g.strokeStyle = '#0b57d0'; g.lineWidth = 3; g.strokeRect(x + 1.5, 1.5, w - 3, H - 3); }
      }
    });
  }
  function hatchTile() {
    const t = document.createElement('canvas'); t.width = t.height = 8;
    const g = t.getContext('2d'); g.fillStyle = '#f3b34c'; g.fillRect(0, 0, 8, 8);
    g.strokeStyle = '#7a4a00'; g.lineWidth = 2; g.beginPath(); g.moveTo(0, 8); g.lineTo(8, 0); g.stroke();
    return t;
  }
  $('upto').addEventListener('change', renderMemory);

  // ---- QPs, negotiation, counters, terminates ---------------------------
  const QPSTATES = ['RESET', 'INIT', 'RTR', 'RTS', 'ERR'];
  function renderQPs() {
    let html = '';
    for (const q of V.qps) {
      const seen = new Set((q.history || []).map((h) => h.state));
      html += '<h3>' + esc(q.dev) + ' QP ' + q.lqpn + ': <span class="pill">' + esc(q.state) + '</span></h3>';
      html += '<svg id="qpsvg" width="520" height="70" role="img" aria-label="queue pair state ' + esc(q.state) + '">';
      QPSTATES.forEach((st, k) => {
        const x = 8 + k * 102, cur = q.state === st;
        html += '<rect x="' + x + '" y="14" width="84" height="30" rx="6" fill="' + (cur ? '#ffe9a8' : seen.has(st) ? '#e8f0e8' : '#fff') + '" stroke="' + (cur ? '#1b1b1b' : '#999') + '" stroke-width="' + (cur ? 3 : 1) + '"/>';
        html += '<text x="' + (x + 42) + '" y="33" text-anchor="middle"' + (cur ? ' font-weight="700"' : '') + '>' + st + (cur ? ' ◀' : '') + '</text>';
        if (k < 4) html += '<line x1="' + (x + 84) + '" y1="29" x2="' + (x + 102) + '" y2="29" stroke="#777" marker-end="url(#qa)"/>';
      });
      html += '<defs><marker id="qa" viewBox="0 0 6 6" refX="5" refY="3" markerWidth="6" markerHeight="6" orient="auto"><path d="M0,0 L6,3 L0,6 z" fill="#777"/></marker></defs>';
      html += '<text x="8" y="62" fill="#555">seen: ' + esc((q.history || []).map((h) => h.state + ' at ' + ms(h.t)).join(', ')) + '</text></svg>';
      html += '<p>MPA rev ' + q.mpa_rev + ', CRC ' + (q.crc ? 'on' : 'off') + ', markers tx ' + (q.markers_tx ? 'on' : 'off') + ' / rx ' + (q.markers_rx ? 'on' : 'off') +
        ', IRD ' + q.ird + ' ORD ' + q.ord + ', P2P RTR ' + esc(q.p2p) + ', EMSS ' + q.emss + (q.src ? ', ' + esc(q.src) + ' ↔ ' + esc(q.dst) : '') +
        ' — ' + link('https://www.rfc-editor.org/rfc/rfc5044.html#section-7.1', 'RFC 5044 §7.1') + ', ' + link('https://www.rfc-editor.org/rfc/rfc6581.html#section-9', 'RFC 6581 §9') +
        ', ' + link('https://www.rfc-editor.org/rfc/rfc5040.html#section-6', 'RFC 5040 §6') + '</p>';
    }
    $('qpbody').innerHTML = html || '<p>No queue pair reported.</p>';
    let neg = '';
    for (const d of V.conns) {
      const unseen = (d.not_observed ? d.not_observed + ' octets, picked up again ' + (d.resyncs || 0) + '×' : '—') + (d.unsynced ? ', ' + d.unsynced + ' segments not analysed' : '') +
        (d.note ? '; ' + d.note : '');
      // Segments judged: first transmissions and the retransmissions the checker could place on the FPDU grid.
      const aligned = d.aligned + (d.retransmissions_aligned || 0), judged = d.fpdu_segments + (d.retransmissions_judged || 0);
      neg += '<tr data-src="' + esc(d.src) + '" data-dst="' + esc(d.dst) + '" data-aligned="' + aligned + '" data-fpdu-segments="' + judged + '" data-fpdus="' + d.fpdus + '"><td>' + d.conn + '</td><td class="mono">' + esc(d.src) + ' &gt; ' + esc(d.dst) + '</td><td>' + esc(d.role || '-') + '</td><td class="mono">' + esc(d.frame || '-') +
        '</td><td>CRC ' + (d.crc ? 'on' : 'off') + ', markers ' + (d.markers ? 'on' : 'off') + '</td><td>' + aligned + '/' + judged + '</td><td>' + d.fpdus +
        (d.crc ? ' (' + d.crc_good + ' good, ' + d.crc_bad + ' bad)' : '') + '</td><td>' + (d.held || 0) + '</td><td>' + esc(unseen) + '</td></tr>';
    }
    $('negbody').innerHTML = neg ? '<table><thead><tr><th>conn</th><th>direction</th><th>role</th><th>MPA frame sent</th><th>mode</th><th>aligned</th><th>FPDUs</th><th>out of order</th><th>not observed</th></tr></thead><tbody>' + neg + '</tbody></table>' : '<p>No MPA exchange seen.</p>';
    let cs = '';
    const all = $('allc').checked;
    for (const dev of Object.keys(V.stats).sort()) {
      const st = V.stats[dev];
      for (const layer of ['tcp', 'mpa', 'ddp', 'rdmap', 'verbs', 'other']) {
        const list = (st[layer] || []).filter((c) => all || c.value);
        if (!list.length) continue;
        cs += '<div><b>' + esc(dev) + ' ' + layer + '</b><br>' + list.map((c) => '<span title="' + esc(c.doc || '') + '">' + esc(c.name) + ' ' + c.value + '</span>').join('<br>') + '</div>';
      }
    }
    $('cntbody').innerHTML = cs ? '<div class="counters">' + cs + '</div>' : '<p>No counters reported.</p>';
    $('termbody').innerHTML = V.terms.length ? '<ul>' + V.terms.map((t) => '<li><a href="#" data-seg="' + t.seg + '">segment ' + t.seg + '</a> ' + (t.o ? 'sent' : 'received') +
      ': <span class="mono">' + esc(t.detail) + '</span> — the rule: ' + link(t.rfc, t.rfc.replace(/.*rfc(\d+)\.html#section-([\d.]+)/, 'RFC $1 §$2')) + '</li>').join('') + '</ul>' : '<p>No Terminate.</p>';
    $('termbody').querySelectorAll('a[data-seg]').forEach((a) => a.addEventListener('click', (e) => { e.preventDefault(); select(+a.dataset.seg); ladder.focus(); }));
  }
  $('allc').addEventListener('change', renderQPs);

  // ---- steps ------------------------------------------------------------
  function renderSteps() {
    const box = $('steps');
    if (!V.steps.length) { box.innerHTML = ''; return; }
    box.innerHTML = '<ul>' + V.steps.map((s, k) => '<li tabindex="0" data-k="' + k + '"><b>' + esc(s.title) + '</b>' + (s.text ? '<div class="text">' + esc(s.text) + '</div>' : '') + '</li>').join('') + '</ul>';
    box.querySelectorAll('li').forEach((li) => {
      const go = () => { const st = V.steps[+li.dataset.k]; select(Math.min(st.seg, V.segs.length - 1)); markStep(+li.dataset.k); ladder.focus(); };
      li.addEventListener('click', go);
      li.addEventListener('keydown', (e) => { if (e.key === 'Enter') go(); });
    });
  }
  // markStep marks step k as the current one and scrolls the steps' list
  // (only it) to show it.
  function markStep(k) {
    const box = $('steps'), b = box.getBoundingClientRect();
    box.querySelectorAll('li').forEach((li) => {
      li.classList.toggle('cur', +li.dataset.k === k);
      if (+li.dataset.k !== k) return;
      const r = li.getBoundingClientRect();
      if (r.top < b.top) box.scrollTop += r.top - b.top;
      else if (r.bottom > b.bottom) box.scrollTop += Math.min(r.bottom - b.bottom, r.top - b.top);
    });
  }

  // ---- round trip anatomy ------------------------------------------------
  // The daemons' hop stamps taken apart (package anatomy): per connection
  // and direction a table of each leg's median and 99th percentile in µs,
  // as siwtun ctl anatomy prints them, with a bar per leg: solid to the
  // median, outlined to the 99th percentile, on one scale per connection
  // (the largest median fills two thirds of it; a longer p99 runs off it).
  // µs with one decimal as the CLI prints them (Go's %.1f): toFixed breaks
  // an exact tie upwards where Go rounds it to even; an exact tie is a
  // whole number of ns that is 250 modulo 500 (a double holds it exactly).
  function usText(st, ns) {
    if (!st.n) return '-';
    const a = Math.abs(ns);
    if (a % 500 !== 250) return (ns / 1000).toFixed(1);
    const q = (a - 50) / 100, t = q % 2 === 0 ? q : q + 1;
    return (ns < 0 ? '-' : '') + (t / 10).toFixed(1);
  }
  function anatomyBar(st, scale, big) {
    if (!st.n || !scale) return '';
    const pc = (ns) => Math.min(100, 100 * ns / scale).toFixed(2) + '%';
    return '<div class="abar' + (st.p99 > scale ? ' off' : '') + '" role="img" aria-label="median ' + usText(st, st.med) + ' µs, p99 ' + usText(st, st.p99) + ' µs"><div class="p99" style="width:' + pc(st.p99) +
      '"></div><div class="med" style="width:' + pc(st.med) + '"></div></div>' + (big ? '<span class="big">◀ largest</span>' : '');
  }
  function anatomyDir(c, d, scale) {
    const legs = c.legs.filter((l) => !l.total);
    const largest = legs.reduce((b, l, k) => (l.dirs[d].n && (b < 0 || l.dirs[d].med > legs[b].dirs[d].med) ? k : b), -1);
    let h = '<h4>' + esc(c.dirs[d]) + '</h4><table class="anatomy" data-dir="' + d + '"><thead><tr><th>leg</th><th class="num">median µs</th><th class="num">p99 µs</th><th class="num">N</th>' +
      '<th class="barh">median ■ p99 □</th></tr></thead><tbody>';
    c.legs.forEach((l, k) => {
      const st = l.dirs[d];
      h += '<tr data-from="' + esc(l.from) + '" data-to="' + esc(l.to) + '"' + (l.total ? ' class="total" data-total="1"' : '') + ' data-med="' + st.med + '" data-p99="' + st.p99 + '" data-n="' + st.n +
        '"><td>' + (l.total ? '= ' : '') + esc(l.name) + ' <span class="hops">' + esc(l.from) + ' → ' + esc(l.to) + '</span></td><td class="num">' + usText(st, st.med) + '</td><td class="num">' +
        usText(st, st.p99) + '</td><td class="num">' + st.n + '</td><td>' + (l.total ? '' : anatomyBar(st, scale, k === largest)) + '</td></tr>';
    });
    return h + '</tbody></table>';
  }
  function anatomyConn(c, ci) {
    const meds = c.legs.filter((l) => !l.total).flatMap((l) => l.dirs.map((st) => (st.n ? st.med : 0)));
    const scale = 1.5 * Math.max(0, ...meds);
    let h = '<div class="anatconn" data-conn="' + ci + '"><h3>' + esc(c.title) + '</h3>' + anatomyDir(c, 0, scale) + anatomyDir(c, 1, scale);
    const rt = c.rt;
    h += '<p class="rt" data-med="' + rt.med + '" data-p99="' + rt.p99 + '" data-n="' + rt.n + '">' + (rt.n ? 'round trip: post → seen the answer (' + esc(c.dirs[0].split(' -> ')[0]) +
      '\'s application): median ' + usText(rt, rt.med) + ' µs, p99 ' + usText(rt, rt.p99) + ' µs over ' + rt.n + ' round trips' : 'no stamps of the applications: their legs are empty (only siwtun perf --anatomy hands them over)') + '</p>';
    return h + '</div>';
  }
  function anatomyAction(action) {
    const st = $('anatstate');
    document.querySelectorAll('.anatctl button').forEach((b) => { b.disabled = true; });
    if (st) st.textContent = action === 'start' ? 'starting…' : 'reading the daemons’ stamps…';
    fetch('anatomy?action=' + action, { method: 'POST', headers: { 'X-Siwtun-Page': '1' } }).then((r) => (r.ok ? '' : r.text())).catch((e) => String(e)).then((err) => {
      if (!err) return; // the update comes on the event stream
      renderAnatomy();
      const box = $('anatstate');
      if (box) { box.textContent = action + ' failed: ' + err; box.classList.add('bad'); }
    });
  }
  function renderAnatomy() {
    const A = V.anatomy;
    $('anat').hidden = !A;
    if (!A) return;
    let h = '';
    if (A.control) {
      h += '<p class="anatctl"><button id="anatstart" data-action="start"' + (A.recording ? ' disabled' : '') + '>Record</button><button id="anatstop" data-action="stop"' +
        (A.recording ? '' : ' disabled') + '>Stop and show</button><button id="anatshow" data-action="show">Show so far</button><span id="anatstate" data-recording="' + (A.recording ? 1 : 0) + '">' +
        (A.recording ? 'recording: both daemons stamp every hop; run a ping-pong now (siwtun perf write --lat)' : 'not recording: the daemons stamp nothing') + '</span></p>';
    }
    if (A.note) h += '<p class="note">' + esc(A.note) + '</p>';
    (A.conns || []).forEach((c, ci) => { h += anatomyConn(c, ci); });
    if (A.lost) h += '<p>' + A.lost + ' stamps were lost (each daemon keeps the newest): the oldest messages are incomplete.</p>';
    $('anatbody').innerHTML = h;
    $('anatbody').querySelectorAll('.anatctl button').forEach((b) => b.addEventListener('click', () => anatomyAction(b.dataset.action)));
  }

  // ---- header -----------------------------------------------------------
  function renderHead() {
    let left = 0;
    for (const g of V.gaps) left += g.segs;
    $('meta').textContent = V.segs.length + ' segments, ' + V.places.length + ' placements, ' + V.wcs.length + ' completions' +
      (V.gaps.length ? '; not observed: ' + left + ' segments in ' + V.gaps.length + ' windows the daemons left out (' + V.dropped + ' events)' : '') +
      (V.sampling ? '; sampling: ' + V.sampling : '') + (V.full ? '; the view holds as many segments as it may: later traffic is not shown (start siwtun web again, or give it a larger --max-segments)' : '') +
      (V.live ? ' — live' : '');
    $('lname').textContent = V.local || 'local';
    $('rname').textContent = V.peer || 'peer';
  }

  // ---- live ---------------------------------------------------------------
  function apply(u) {
    if (u.seg) { u.seg.full = true; V.segs[u.seg.n] = u.seg; }
    if (u.place) V.places[u.place.n] = u.place;
    if (u.region) V.regions[u.region_n || 0] = u.region;
    if (u.term) V.terms.push(u.term);
    if (u.wc) V.wcs.push(u.wc);
    if (u.qps) V.qps = u.qps;
    if (u.stats) V.stats = u.stats;
    if (u.conns) V.conns = u.conns;
    if (u.conn) V.conns[u.conn_n || 0] = u.conn;
    if (u.step) V.steps[u.step.n] = u.step;
    if (u.dropped) V.dropped = u.dropped;
    if (u.gap) V.gaps[u.gap.n] = u.gap;
    if (u.full) V.full = true;
    if (u.addr) V.addrs[u.addr_n || 0] = u.addr;
    if (u.anatomy) { V.anatomy = u.anatomy; state.anatDirty = true; }
    V.version = u.v;
  }
  let pending = false;
  function refresh() {
    pending = false;
    renderHead(); renderQPs(); renderSteps();
    if (state.anatDirty) { state.anatDirty = false; renderAnatomy(); }
    if (state.follow && V.segs.length) { select(V.segs.length - 1); } else { renderMemory(); }
    requestDraw();
  }
  if (V.live) {
    const es = new EventSource('events?from=' + V.version);
    es.onmessage = (e) => {
      apply(JSON.parse(e.data));
      if (!pending) { pending = true; setTimeout(refresh, 100); }
    };
    es.addEventListener('reload', () => { es.close(); location.reload(); });
    es.onerror = () => { $('meta').textContent += ' (stream ended)'; es.close(); };
  }

  // ---- start -----------------------------------------------------------------
  renderLegend(); sizeLadder(); renderHead(); renderSteps(); renderQPs(); renderAnatomy(); renderByteMap(); renderMemory(); drawLadder();
  onDetails = () => { renderByteMap(); };
  timing.drawn = performance.now();
  // render draws everything now (tests read the page in one consistent state).
  function render() { refresh(); drawLadder(); }
  window.siwtunView = { view: V, select: select, state: state, timing: timing, detail: detail, rowTime: first, render: render, ready: true };
  document.body.dataset.ready = '1';
  }
})();
