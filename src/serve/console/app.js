// The console: a client of the HTTP API (/v1/), served from the binary.
// Everything it shows goes into the page as text (textContent, never
// innerHTML): job output and error messages are hostile input.
'use strict';

// How often a view reads again while the page is shown, and how old an
// answer it accepts: one read per view per interval, shared by viewers.
const REFRESH_MS = 5000;
const MAX_AGE = 5;
// Periods read per request of the grid; one statement per page.
const PAGE = 1000;
// The most periods a grid shows, and a run asks for.
const MOST = 10000;
// The words of the one period rule, as the API sends them; `late` is a
// mark on a cell, not a state of its own.
const STATES = ['succeeded', 'adopted', 'failed', 'running', 'due', 'ready', 'waiting', 'missed',
  'stale', 'released', 'lease expired', 'before first seen', 'not due'];

let session = null;
let view = null;

// --- the page, built as nodes ----------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === 'class') node.className = value;
    else if (name.startsWith('on')) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? '' : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : plain(child));
  }
  return node;
}

// Characters that reorder the text around them (a right-to-left override
// makes `gnp.exe` read `exe.png`) are shown as their code instead.
function plain(text) {
  return String(text).replace(/[\u202a-\u202e\u2066-\u2069\u200e\u200f]/g,
    (c) => '\\u{' + c.charCodeAt(0).toString(16) + '}');
}

function stateClass(state) {
  return 's-' + String(state || 'due').replace(/ /g, '-');
}

// A period's cell; one split into shards is split into a strip per shard,
// each in its shard's colour.
function cell(job, period, state, title, late, shards) {
  const words = state + (late ? ', late' : '');
  const strips = (shards || []).map((s) => el('span', { class: stateClass(s.state), 'data-shard': s.shard }));
  return el('a', {
    class: 'cell ' + stateClass(state) + (late ? ' late' : '') + (strips.length ? ' split' : ''),
    href: periodHref(job, period),
    title: title || period + ' \u2014 ' + words,
    'aria-label': period + ': ' + words,
    'data-period': period,
    'data-state': state,
    'data-late': late ? 'true' : null,
  }, strips);
}

// The shard a period key names (`billing:2026-11#3/8`), or null.
function shardOf(key) {
  const m = /#(\d+)\/(\d+)$/.exec(key || '');
  return m ? { index: Number(m[1]), of: Number(m[2]) } : null;
}

// `4 shards: 3 succeeded, 1 failed` for a period split into shards.
function shardWords(shards) {
  const counts = {};
  for (const s of shards) counts[s.state] = (counts[s.state] || 0) + 1;
  return shards.length + ' shards: ' + Object.entries(counts).map(([st, n]) => n + ' ' + st).join(', ');
}

function stateBadge(state) {
  return el('span', { class: 'state', 'data-state': state },
    el('span', { class: 'cell ' + stateClass(state) }), state);
}

function legend() {
  return el('div', { class: 'legend', 'aria-label': 'legend' },
    STATES.map((s) => el('span', {}, el('span', { class: 'cell ' + stateClass(s) }), s)),
    el('span', {}, el('span', { class: 'cell s-due late' }), 'late (a mark: past its deadline)'));
}

function jobHref(job) { return '#/job/' + encodeURIComponent(job); }
function periodHref(job, period) {
  return jobHref(job) + '/period/' + encodeURIComponent(period);
}

// An instant as the API gives it (UTC), how far from now, and, given the
// job's zone, its wall time there: schedules are read in that zone.
function when(text, zone) {
  if (!text) return '\u2014';
  const ms = Date.parse(text) - Date.now();
  const abs = Math.abs(ms) / 1000;
  const span = abs < 90 ? Math.round(abs) + ' s' : abs < 5400 ? Math.round(abs / 60) + ' min'
    : abs < 129600 ? Math.round(abs / 3600) + ' h' : Math.round(abs / 86400) + ' d';
  let local = '';
  if (zone && zone !== 'UTC') {
    try {
      local = ', ' + new Intl.DateTimeFormat('sv-SE', {
        timeZone: zone, year: 'numeric', month: '2-digit', day: '2-digit',
        hour: '2-digit', minute: '2-digit', second: '2-digit',
      }).format(new Date(text)) + ' ' + zone;
    } catch (e) { local = ''; }
  }
  return text + local + ' (' + (ms >= 0 ? 'in ' + span : span + ' ago') + ')';
}

// The notification fields the period page shows, in words.
const NOTIFICATION_COLUMNS = [['notifier', 'notifier'], ['event', 'event'], ['state', 'state'],
  ['tries', 'tries'], ['status', 'last HTTP status'], ['error', 'last error'],
  ['created_at', 'raised at'], ['finished_at', 'delivered or given up at']];

function duration(start, end) {
  if (!start || !end) return '\u2014';
  const s = (Date.parse(end) - Date.parse(start)) / 1000;
  return s < 60 ? s.toFixed(1) + ' s' : s < 3600 ? (s / 60).toFixed(1) + ' min' : (s / 3600).toFixed(1) + ' h';
}

function show(...nodes) {
  const main = document.getElementById('main');
  main.replaceChildren(...nodes);
}

function toast(text, bad) {
  const old = document.querySelector('.toast');
  if (old) old.remove();
  const node = el('div', { class: 'toast' + (bad ? ' bad' : ''), role: 'status' }, text);
  document.body.append(node);
  setTimeout(() => node.remove(), 6000);
}

// --- the API -------------------------------------------------------------

class LoggedOut extends Error {}

async function api(method, path, body, key) {
  const headers = { Accept: 'application/json' };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  if (key) headers['Idempotency-Key'] = key;
  const response = await fetch(path, {
    method, headers, credentials: 'same-origin', cache: 'no-store',
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  let data = null;
  try { data = await response.json(); } catch (_) { data = null; }
  if (response.status === 401 && path !== '/console/session') {
    session = null;
    login();
    throw new LoggedOut();
  }
  return { status: response.status, data: data || {}, headers: response.headers };
}

// Until then reads ask for fresh answers: an action just done must show.
let freshUntil = 0;

async function read(path) {
  const shared = Date.now() < freshUntil ? '' : (path.includes('?') ? '&' : '?') + 'max_age=' + MAX_AGE;
  const answer = await api('GET', path + shared);
  if (answer.status !== 200) throw new Error(answer.data.error || 'the server answered ' + answer.status);
  return answer.data;
}

// One Idempotency-Key per operation: made at the click, kept by the button
// until the operation has a final answer, sent again unchanged on a retry.
function newKey() {
  const bytes = new Uint8Array(16);
  crypto.getRandomValues(bytes);
  return Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');
}

const sleep = (ms) => new Promise((done) => setTimeout(done, ms));

// Operations sent and not yet answered for good, by what they ask: a
// button drawn again by a refresh, clicked again, sends the same key.
const operations = new Map();
let inFlight = 0;

async function act(button, path, body) {
  if (button.disabled) return null;
  button.disabled = true;
  const operation = path + ' ' + JSON.stringify(body === undefined ? {} : body);
  if (!operations.has(operation)) operations.set(operation, newKey());
  button.operationKey = operations.get(operation);
  inFlight += 1;
  try {
    for (let attempt = 1; attempt <= 6; attempt++) {
      let answer;
      try {
        answer = await api('POST', path, body === undefined ? {} : body, button.operationKey);
      } catch (e) {
        if (e instanceof LoggedOut) throw e;
        await sleep(1000 * attempt);
        continue;
      }
      // Nothing ran (every slot taken, or the database away), or the
      // same operation is being answered: the same key again.
      const again = answer.status === 429 || answer.status >= 500
        || (answer.status === 409 && !answer.headers.get('Location'));
      if (again && attempt < 6) {
        toast((answer.data.error || 'the server answered ' + answer.status) + '; trying again as the same operation\u2026');
        await sleep(1000 * attempt);
        continue;
      }
      operations.delete(operation);
      freshUntil = Date.now() + 2 * REFRESH_MS;
      return answer;
    }
    return null;
  } finally {
    inFlight -= 1;
    button.disabled = false;
  }
}

function confirmed(text) {
  const dialog = document.getElementById('confirm');
  document.getElementById('confirm-text').textContent = text;
  return new Promise((done) => {
    dialog.addEventListener('close', () => done(dialog.returnValue === 'yes'), { once: true });
    dialog.returnValue = '';
    dialog.showModal();
  });
}

function may(word) { return session && session.allow.includes(word); }

// An operator's button: hidden for a token not allowed `need`; the API
// refuses such a request anyway.
function action(label, need, opts, run) {
  if (!may(need)) return null;
  const button = el('button', {
    type: 'button', class: opts.danger ? 'danger' : opts.plain ? 'plain' : '', 'data-action': opts.name,
  }, label);
  button.addEventListener('click', async () => {
    const question = typeof opts.confirm === 'function' ? opts.confirm() : opts.confirm;
    if (question && !(await confirmed(question))) return;
    try {
      await run(button);
    } catch (e) {
      if (!(e instanceof LoggedOut)) toast(String(e.message || e), true);
    }
  });
  return button;
}

async function startRun(button, job, body) {
  const answer = await act(button, '/v1/jobs/' + encodeURIComponent(job) + '/runs', body);
  if (!answer) return toast('the server did not answer; the same click sent again runs once', true);
  const location = answer.headers.get('Location');
  if (location && (answer.status === 202 || answer.status === 200 || answer.status === 409)) {
    window.location.hash = '#/run/' + encodeURIComponent(location.split('/').pop());
    return null;
  }
  return toast(answer.data.error || 'the server answered ' + answer.status, answer.status >= 400);
}

function pauseButton(job) {
  const paused = job.paused;
  return action(paused ? 'Resume' : 'Pause', 'operate', {
    name: paused ? 'resume' : 'pause', plain: true,
    confirm: paused ? null : 'Pause ' + job.job + '? Its fires are skipped until it is resumed.',
  }, async (button) => {
    const verb = paused ? 'resume' : 'pause';
    const answer = await act(button, '/v1/jobs/' + encodeURIComponent(job.job) + '/' + verb);
    if (answer && answer.status === 200) {
      toast(job.job + (paused ? ' resumed' : ' paused'));
      refresh(true);
    } else if (answer) {
      toast(answer.data.error || 'the server answered ' + answer.status, true);
    }
  });
}

// --- the views -----------------------------------------------------------

async function jobsView() {
  const data = await read('/v1/jobs?recent=20');
  const cards = data.jobs.map((job) => {
    const last = job.last;
    return el('div', { class: 'card job', 'data-job': job.job },
      el('div', {},
        el('a', { class: 'name', href: jobHref(job.job) }, job.job),
        job.paused ? el('span', { class: 'badge paused' }, 'paused') : null,
        job.late.length ? el('span', { class: 'badge late', title: job.late.join('\n') }, job.late.length + ' late') : null,
        job.waiting ? el('span', { class: 'badge waiting' }, job.waiting + ' waiting') : null,
        el('div', { class: 'strip' }, (job.recent || []).map((p) => cell(job.job, p.period, p.state, null, p.late)))),
      el('div', { class: 'facts' },
        el('div', {}, job.schedule_words),
        el('div', { class: 'muted' }, el('code', {}, job.schedule), ' \u00b7 ', job.timezone,
          ' \u00b7 ', job.period, job.covers === 'previous' ? ' (covers the previous)' : ''),
        job.after.length ? el('div', { class: 'muted' }, 'after ', job.after.join(', ')) : null),
      el('div', { class: 'facts' },
        job.paused ? el('div', {}, 'next: paused') : [
          el('div', {}, 'next: ', job.next_key ? el('span', { class: 'mono' }, job.next_key) : '\u2014'),
          el('div', { class: 'muted' }, when(job.next_fire, job.timezone))],
        el('div', {}, 'last finished: ', last ? [el('a', { href: periodHref(job.job, last.period) }, last.period),
          ' ', last.state] : '\u2014')),
      el('div', { class: 'actions' }, pauseButton(job)));
  });
  return [el('h1', {}, 'Jobs'), legend(),
    cards.length ? el('div', { class: 'jobs' }, cards) : el('p', { class: 'muted' }, 'No jobs.')];
}

function query(params) {
  return Object.entries(params).filter(([, v]) => v).map(([k, v]) => k + '=' + encodeURIComponent(v)).join('&');
}

async function jobView(name, params) {
  const jobs = await read('/v1/jobs');
  const job = jobs.jobs.find((j) => j.job === name);
  if (!job) return [el('h1', {}, name), el('p', { class: 'error' }, 'No job named ' + name + '.')];
  const grid = el('div', { class: 'grid', id: 'grid', 'aria-label': 'periods of ' + name });
  const summary = el('p', { class: 'range muted', id: 'range' }, 'reading\u2026');
  const from = el('input', { id: 'from', placeholder: 'from (label)', value: params.get('from') || '' });
  const to = el('input', { id: 'to', placeholder: 'to (label)', value: params.get('to') || '' });
  const go = el('button', { type: 'submit', class: 'plain' }, 'Show');
  const rangeForm = el('form', { class: 'toolbar', id: 'range-form' }, from, to, go,
    el('a', { href: jobHref(name) }, 'last 30'));
  rangeForm.addEventListener('submit', (event) => {
    event.preventDefault();
    window.location.hash = jobHref(name) + '?' + query({ from: from.value.trim(), to: to.value.trim() });
  });
  const counts = {};
  let shown = null;
  let lastDue = null;
  // The first period shown that the job owes: bulk runs start there, so
  // they never take periods from before the job was first seen.
  let firstOwed = null;
  const fill = (page) => {
    const fragment = document.createDocumentFragment();
    for (const p of page.periods) {
      if (p.state !== 'not due') lastDue = p.period;
      if (!firstOwed && p.state !== 'before first seen' && p.state !== 'not due') firstOwed = p.period;
      counts[p.state] = (counts[p.state] || 0) + 1;
      if (p.late) counts.late = (counts.late || 0) + 1;
      fragment.append(cell(name, p.period, p.state, p.period + ' \u2014 ' + p.state
        + (p.late ? ', late' : '') + (p.shards ? '\n' + shardWords(p.shards) : '')
        + (p.waiting_for ? '\n' + p.waiting_for : ''), p.late, p.shards));
    }
    grid.append(fragment);
  };
  const tally = () => Object.entries(counts).map(([s, n]) => n + ' ' + s).join(', ');
  // The first page is painted at once; the rest follow, one request each.
  const load = async () => {
    if (params.get('from') && params.get('to')) {
      let next = params.get('from');
      let first = true;
      let taken = 0;
      while (next && taken < MOST) {
        const page = await read('/v1/jobs/' + encodeURIComponent(name) + '/periods?'
          + query({ from: next, to: params.get('to'), limit: String(PAGE) }));
        fill(page);
        taken += page.periods.length;
        if (first) {
          first = false;
          shown = { from: page.from, to: params.get('to') };
          performance.mark('grid:first-page');
          requestAnimationFrame(() => setTimeout(() => performance.mark('grid:painted'), 0));
        }
        next = page.next;
        if (next && taken >= MOST) shown.to = page.to;
        summary.textContent = params.get('from') + ' \u2026 ' + (page.to || '') + (next ? (taken >= MOST
          ? ' (the first ' + MOST + ' periods of the range: ask for a shorter one to see the rest)'
          : ' (reading more\u2026)') : '') + ': ' + tally();
      }
      performance.mark('grid:complete');
    } else {
      const page = await read('/v1/jobs/' + encodeURIComponent(name) + '/periods?'
        + query({ last: params.get('last') || '30', to: params.get('to') }));
      fill(page);
      shown = { from: page.from, to: page.to };
      performance.mark('grid:first-page');
      requestAnimationFrame(() => setTimeout(() => performance.mark('grid:painted'), 0));
      summary.textContent = (page.from || '') + ' \u2026 ' + (page.to || '') + ': ' + tally();
      if (page.previous) {
        summary.append(' \u00b7 ', el('a', { href: jobHref(name) + '?' + query({ last: '30', to: page.previous }) }, 'older'));
      }
    }
  };
  const shownCount = (state) => counts[state] || 0;
  // A run asks for the periods shown up to the last that is due: one not
  // due yet would need `early`, which the console does not offer.
  const dueTo = () => {
    if (!lastDue) throw new Error('no period shown is due yet');
    return lastDue;
  };
  const owedFrom = () => {
    if (!firstOwed) throw new Error('every period shown is from before the job was first seen: run one from its page');
    return firstOwed;
  };
  const runs = el('div', { class: 'toolbar' },
    action('Run the failed', 'trigger', {
      name: 'run-failed', plain: true,
      confirm: () => 'Run again the ' + shownCount('failed') + ' failed period(s) shown? The others are passed over.',
    }, (button) => startRun(button, name, { from: owedFrom(), to: dueTo(), only_failed: true })),
    action('Run all not succeeded', 'trigger', {
      name: 'run-range', plain: true,
      confirm: () => 'Run every period shown that the job owes and has not succeeded: ' + shownCount('failed') + ' failed, '
        + (shownCount('due') + shownCount('missed') + shownCount('ready')) + ' never claimed, and any released? Succeeded and adopted ones are passed over, and so are the '
        + shownCount('before first seen') + ' from before the job was first seen.',
    }, (button) => startRun(button, name, { from: owedFrom(), to: dueTo() })),
    action('Rerun all shown (force)', 'trigger', {
      name: 'rerun-range', danger: true,
      confirm: () => 'Run all the periods shown that the job owes again, succeeded ones included (not the '
        + shownCount('before first seen') + ' from before the job was first seen)?',
    }, (button) => startRun(button, name, { from: owedFrom(), to: dueTo(), force: true })),
    pauseButton(job));
  const page = [
    el('h1', {}, name, job.paused ? el('span', { class: 'badge paused' }, 'paused') : null),
    el('dl', { class: 'facts card' },
      el('dt', {}, 'schedule'), el('dd', {}, job.schedule_words, ' \u2014 ', el('code', {}, job.schedule), ' in ', job.timezone),
      el('dt', {}, 'period'), el('dd', {}, job.period, job.covers === 'previous' ? ', a fire covers the previous' : ''),
      el('dt', {}, 'next fire'), el('dd', {}, when(job.next_fire, job.timezone), ' ', job.next_key ? el('code', {}, job.next_key) : ''),
      job.deadline ? [el('dt', {}, 'deadline'), el('dd', {}, job.deadline + ' after the fire')] : null,
      job.after.length ? [el('dt', {}, 'after'), el('dd', {}, job.after.map((a) => [el('a', { href: jobHref(a) }, a), ' ']),
        '(on an upstream rerun: ', job.on_upstream_rerun, ')')] : null,
      el('dt', {}, 'late'), el('dd', {}, job.late.length ? job.late.join(', ') : 'none'),
      el('dt', {}, 'waiting'), el('dd', {}, String(job.waiting))),
    rangeForm, legend(), summary, grid, runs];
  return { nodes: page, after: load };
}

async function periodView(name, label) {
  const data = await read('/v1/jobs/' + encodeURIComponent(name) + '/periods/' + encodeURIComponent(label));
  const claim = data.claim;
  const attempts = data.attempts || [];
  // A late period may be running: what its claim says decides.
  const running = Boolean(claim && claim.state === 'running');
  const actions = el('div', { class: 'toolbar' },
    !running && !['succeeded', 'stale', 'adopted', 'not due'].includes(data.state)
      ? action('Run', 'trigger', { name: 'run' }, (button) => startRun(button, name, { period: data.period })) : null,
    data.state === 'not due' ? null : action('Rerun (force)', 'trigger', {
      name: 'rerun', danger: true,
      confirm: 'Run ' + data.period_key + ' again, even if it succeeded?',
    }, (button) => startRun(button, name, { period: data.period, force: true })),
    running ? action('Release', 'operate', {
      name: 'release', danger: true,
      confirm: 'Release ' + data.period_key + '? Its runner is stopped and the period runs again.',
    }, async (button) => {
      const answer = await act(button, '/v1/jobs/' + encodeURIComponent(name) + '/periods/' + encodeURIComponent(data.period) + '/release');
      if (answer) toast(answer.data.error || 'released; claimable by ' + (answer.data.claimable_by || 'now'), answer.status >= 400);
      refresh(true);
    }) : null);
  const upstream = (data.upstream || []).map((u) => el('tr', {},
    el('td', {}, el('a', { href: jobHref(u.job) }, u.job)), el('td', {}, u.done + ' of ' + u.needed),
    el('td', { class: 'mono' }, (u.missing || []).join(', '))));
  const zone = data.timezone;
  const split = Boolean(data.shards);
  // Newest first; of a period split into shards, each shard's newest
  // attempt is opened.
  const ordered = attempts.slice().sort((x, y) => Date.parse(y.started_at) - Date.parse(x.started_at));
  const opened = new Set();
  const newestOf = (key) => (opened.has(key) ? false : Boolean(opened.add(key)));
  const rows = ordered.map((a) => [
    el('tr', { 'data-attempt': a.attempt, 'data-shard': split ? String(shardOf(a.period_key).index) : null },
      split ? el('td', {}, '#' + shardOf(a.period_key).index) : null,
      el('td', {}, a.attempt),
      el('td', {}, a.trigger, a.requested_by ? el('div', { class: 'muted' }, 'by ' + a.requested_by) : null,
        a.asked && a.asked !== a.trigger ? el('div', { class: 'muted' }, a.asked) : null),
      el('td', { class: 'mono' }, a.owner),
      el('td', {}, a.started_at),
      el('td', {}, duration(a.started_at, a.finished_at)),
      el('td', {}, stateBadge(a.outcome)),
      el('td', {}, a.exit_code !== null && a.exit_code !== undefined ? 'exit ' + a.exit_code
        : a.http_status ? 'HTTP ' + a.http_status : '\u2014'),
      el('td', { class: 'mono', title: a.definition || '' }, a.definition ? a.definition.slice(0, 12) : '\u2014'),
      el('td', { class: 'error' }, a.error || '')),
    el('tr', {}, el('td', { colspan: split ? 10 : 9 },
      outputDetails(name, data.period, a, newestOf(a.period_key)))),
  ]);
  const shardRows = (data.shards || []).map((s) => el('tr', { 'data-shard': s.shard },
    el('td', {}, '#' + s.shard), el('td', {}, stateBadge(s.state)),
    el('td', {}, s.attempt === null ? '\u2014' : String(s.attempt)),
    el('td', { class: 'mono' }, s.owner || '\u2014'),
    el('td', {}, s.finished_at ? when(s.finished_at, zone) : '\u2014')));
  const shown = (v) => (v === null || v === undefined ? '\u2014' : typeof v === 'object' ? JSON.stringify(v) : String(v));
  const notes = (data.notifications || []).map((n) => el('tr', {},
    NOTIFICATION_COLUMNS.map(([k]) => el('td', {}, shown(n[k])))));
  const noteHead = notes.length ? el('tr', {}, NOTIFICATION_COLUMNS.map(([, h]) => el('th', {}, h))) : null;
  return [
    el('p', {}, el('a', { href: jobHref(name) }, '\u2190 ' + name)),
    el('h1', {}, data.period_key),
    el('dl', { class: 'facts card' },
      el('dt', {}, 'state'), el('dd', { id: 'period-state' }, stateBadge(data.state), data.late ? el('span', { class: 'badge late' }, 'late') : null),
      el('dt', {}, 'fire'), el('dd', {}, when(data.fire, zone)),
      claim ? [el('dt', {}, 'attempt'), el('dd', {}, String(claim.attempt) + ' (' + claim.failures + ' failed)'),
        el('dt', {}, 'runner'), el('dd', { class: 'mono' }, claim.owner)] : null,
      claim && claim.lease_until ? [el('dt', {}, 'lease until'), el('dd', {}, when(claim.lease_until, zone))] : null,
      claim && claim.retry_at ? [el('dt', {}, 'retry at'), el('dd', {}, when(claim.retry_at, zone))] : null,
      data.waiting_for ? [el('dt', {}, 'waiting for'), el('dd', {}, data.waiting_for)] : null,
      data.stale ? [el('dt', {}, 'stale since'), el('dd', {}, data.stale.upstream + ' succeeded again at ' + data.stale.succeeded_at)] : null),
    actions,
    shardRows.length ? [el('h2', {}, 'Shards'), el('p', { class: 'muted' }, shardWords(data.shards)),
      el('div', { class: 'table' }, el('table', { id: 'shards' },
        el('tr', {}, ['shard', 'state', 'attempt', 'runner', 'finished'].map((h) => el('th', {}, h))), shardRows))] : null,
    upstream.length ? [el('h2', {}, 'Upstream'), el('div', { class: 'table' }, el('table', {},
      el('tr', {}, el('th', {}, 'job'), el('th', {}, 'done'), el('th', {}, 'missing')), upstream))] : null,
    el('h2', {}, 'Attempts'),
    rows.length ? el('div', { class: 'table' }, el('table', { id: 'attempts' },
      el('tr', {}, (split ? ['shard'] : []).concat(['#', 'trigger', 'runner', 'started', 'took', 'outcome', 'exit', 'definition', 'error']).map((h) => el('th', {}, h))),
      rows)) : el('p', { class: 'muted' }, 'Never claimed.'),
    el('h2', {}, 'Notifications'),
    notes.length ? el('div', { class: 'table' }, el('table', {}, noteHead, notes)) : el('p', { class: 'muted' }, 'None.'),
  ];
}

// --- an attempt's whole output ----------------------------------------------

// The output shown of each attempt, kept across the view's refreshes: a page
// read or a follow goes on while the rest of the page is read again.
const outputs = new Map();
// A page: up to 16 chunks of at most 64 KiB each.
const PAGE_CHUNKS = 16;

// The details of attempt `a`: its kept tail at once, then, once opened, its
// whole output a page at a time ("more"), a running one followed live.
function outputDetails(job, label, a, open) {
  const shard = shardOf(a.period_key);
  const key = [job, label, a.attempt, shard ? shard.index : ''].join('\n');
  let shown = outputs.get(key);
  if (!shown) {
    shown = {
      path: '/v1/jobs/' + encodeURIComponent(job) + '/periods/' + encodeURIComponent(label)
        + '/attempts/' + a.attempt + '/output',
      shard: shard ? '&shard=' + shard.index : '',
      pre: el('pre', { class: 'output', 'data-output': a.attempt, 'data-shard': shard ? String(shard.index) : null }, a.output || ''),
      more: el('button', { type: 'button', class: 'more', hidden: true }, 'more output'),
      after: -1, end: 0, started: false, fresh: true, done: false, source: null,
    };
    shown.more.addEventListener('click', () => outputPage(shown));
    outputs.set(key, shown);
  }
  const running = a.outcome === 'running';
  const details = el('details', { open: open || shown.started },
    el('summary', {}, 'output of ' + (shard ? 'shard #' + shard.index + ', ' : '') + 'attempt ' + a.attempt), shown.pre, shown.more);
  const load = () => {
    if (!details.open) return;
    if (!shown.started) {
      shown.started = true;
      if (!running) outputPage(shown);
    }
    if (running && !shown.source && !shown.done) outputFollow(shown);
  };
  details.addEventListener('toggle', load);
  setTimeout(load, 0);
  return details;
}

// Adds chunks to what is shown (the first in place of the kept tail), with
// a line where bytes were not kept.
function outputAdd(shown, chunks) {
  if (shown.fresh && chunks.length) {
    shown.fresh = false;
    shown.pre.textContent = '';
  }
  for (const c of chunks) {
    const gap = c.at_byte - shown.end;
    if (c.lost > 0) shown.pre.append(el('span', { class: 'muted' }, '[\u2026 ' + c.lost + ' byte(s) lost: the database fell behind the job \u2026]\n'));
    else if (gap > 0) shown.pre.append(el('span', { class: 'muted' }, '[\u2026 ' + gap + ' byte(s) past output_max left out \u2026]\n'));
    shown.pre.append(plain(c.text));
    shown.end = c.at_byte + new TextEncoder().encode(c.text).length;
    shown.after = c.seq;
  }
}

// The next page of a finished attempt's output.
async function outputPage(shown) {
  shown.more.disabled = true;
  const answer = await api('GET', shown.path + '?after=' + shown.after + '&limit=' + PAGE_CHUNKS + shown.shard);
  shown.more.disabled = false;
  if (answer.status !== 200) {
    shown.pre.append(el('span', { class: 'error' }, answer.data.error || 'the server answered ' + answer.status));
    return;
  }
  outputAdd(shown, answer.data.chunks);
  shown.done = answer.data.done;
  shown.more.hidden = answer.data.done || answer.data.chunks.length < PAGE_CHUNKS;
}

// A running attempt's output as it is written, until it ends. A broken
// follow is not retried by the browser (it would start over): the next
// refresh follows again from where this one got to.
function outputFollow(shown) {
  const source = new EventSource(shown.path + '?follow=true&after=' + shown.after + shown.shard);
  shown.source = source;
  source.addEventListener('output', (e) => outputAdd(shown, JSON.parse(e.data)));
  source.addEventListener('end', () => {
    source.close();
    shown.source = null;
    shown.done = true;
    refresh(true);
  });
  source.onerror = () => {
    source.close();
    shown.source = null;
  };
}

async function runsView() {
  const data = await read('/v1/runs?limit=100');
  const rows = data.runs.map((r) => el('tr', { 'data-run': r.id },
    el('td', { class: 'mono' }, el('a', { href: '#/run/' + encodeURIComponent(r.id) }, r.id.slice(0, 12))),
    el('td', {}, el('a', { href: jobHref(r.job) }, r.job)),
    el('td', {}, r.requested_by),
    el('td', {}, r.created_at || ''),
    el('td', {}, r.state),
    el('td', {}, r.outcome || '\u2014'),
    el('td', {}, progress(r.periods_listed, r.total, r.counts))));
  return [el('h1', {}, 'Runs'),
    el('p', { class: 'muted' }, 'Runs asked for over the API and the console, newest first.'),
    rows.length ? el('div', { class: 'table' }, el('table', {},
      el('tr', {}, ['run', 'job', 'by', 'asked at', 'state', 'outcome', 'periods'].map((h) => el('th', {}, h))), rows))
      : el('p', { class: 'muted' }, 'None kept.')];
}

function progress(listed, total, counts) {
  const tally = Object.entries(counts || {}).map(([s, n]) => n + ' ' + s).join(', ');
  return (total ? listed + ' of ' + total : String(listed)) + (tally ? ' \u2014 ' + tally : '');
}

async function runView(id) {
  const answer = await api('GET', '/v1/runs/' + encodeURIComponent(id));
  if (answer.status !== 200) return [el('h1', {}, 'Run'), el('p', { class: 'error' }, answer.data.error || String(answer.status))];
  const run = answer.data;
  const counts = {};
  for (const p of run.periods) counts[p.status] = (counts[p.status] || 0) + 1;
  const rows = run.periods.map((p) => {
    // A key is `<job>:<label>`; the run's job may itself hold a colon.
    const label = p.key.startsWith(run.job + ':') ? p.key.slice(run.job.length + 1) : null;
    return el('tr', { 'data-key': p.key },
      el('td', { class: 'mono' }, label === null ? p.key : el('a', { href: periodHref(run.job, label) }, p.key)),
      el('td', {}, stateBadge(p.status)),
      el('td', {}, p.attempt === undefined || p.attempt === null ? '\u2014' : String(p.attempt)),
      el('td', {}, p.detail || ''));
  });
  return [
    el('p', {}, el('a', { href: '#/runs' }, '\u2190 runs')),
    el('h1', {}, 'Run ', el('span', { class: 'mono' }, run.id)),
    el('dl', { class: 'facts card' },
      el('dt', {}, 'job'), el('dd', {}, el('a', { href: jobHref(run.job) }, run.job)),
      el('dt', {}, 'asked by'), el('dd', {}, run.requested_by),
      el('dt', {}, 'runs on'), el('dd', { class: 'mono' }, run.owner),
      el('dt', {}, 'state'), el('dd', { id: 'run-state' }, run.state),
      el('dt', {}, 'outcome'), el('dd', { id: 'run-outcome' }, run.outcome || '\u2014'),
      el('dt', {}, 'progress'), el('dd', {}, progress(run.periods.length, run.total, counts)),
      run.error ? [el('dt', {}, 'error'), el('dd', { class: 'error' }, run.error)] : null),
    el('div', { class: 'table' }, el('table', {},
      el('tr', {}, ['period', 'status', 'attempt', 'detail'].map((h) => el('th', {}, h))), rows)),
  ];
}

// --- routing, refresh and the session -------------------------------------

function route() {
  const hash = window.location.hash.replace(/^#/, '') || '/';
  const [path, search] = hash.split('?');
  const parts = path.split('/').filter(Boolean).map(decodeURIComponent);
  const params = new URLSearchParams(search || '');
  if (parts[0] === 'job' && parts[2] === 'period' && parts.length === 4) return () => periodView(parts[1], parts[3]);
  if (parts[0] === 'job' && parts.length === 2) return () => jobView(parts[1], params);
  if (parts[0] === 'runs') return runsView;
  if (parts[0] === 'run' && parts[1]) return () => runView(parts[1]);
  return jobsView;
}

async function render() {
  if (!session) return;
  const current = window.location.hash;
  view = route();
  try {
    const built = await view();
    if (current !== window.location.hash) return;
    const nodes = Array.isArray(built) ? built : built.nodes;
    show(...nodes.flat(Infinity).filter(Boolean));
    stamp();
    if (built.after) await built.after();
  } catch (e) {
    if (!(e instanceof LoggedOut)) show(el('p', { class: 'error', role: 'alert' }, String(e.message || e)));
  }
}

function stamp() {
  document.getElementById('refreshed').textContent = 'read ' + new Date().toLocaleTimeString();
}

// The shown view is read again every REFRESH_MS while the page is visible;
// a hidden page reads nothing. A grid of a chosen range, which may be
// thousands of periods, is read again only when asked.
async function refresh(now) {
  if (!session || document.visibilityState !== 'visible') return;
  // Not under someone's hands: a field being typed in, a question asked.
  // Nor while an operation is out: its button stays as it is.
  if (!now && (inFlight > 0 || document.activeElement instanceof HTMLInputElement
    || document.getElementById('confirm').open)) return;
  const hash = window.location.hash;
  const big = /^#\/job\/[^/]+\?.*from=/.test(hash);
  if (big && !now) return;
  const open = Array.from(document.querySelectorAll('details[open]'), (d) => d.querySelector('summary').textContent);
  const scroll = window.scrollY;
  await render();
  for (const d of document.querySelectorAll('details')) {
    if (open.includes(d.querySelector('summary').textContent)) d.open = true;
  }
  window.scrollTo(0, scroll);
}

function login() {
  document.getElementById('refreshed').textContent = '';
  document.getElementById('nav').hidden = true;
  document.getElementById('who').hidden = true;
  document.getElementById('logout').hidden = true;
  const form = document.getElementById('login-template').content.cloneNode(true);
  show(form);
  const node = document.getElementById('login');
  node.addEventListener('submit', async (event) => {
    event.preventDefault();
    const input = document.getElementById('token');
    const answer = await api('POST', '/console/session', { token: input.value });
    input.value = '';
    if (answer.status !== 200) {
      const why = answer.status === 401 ? 'That is not the secret of a token of [api] in jobs.toml.'
        : answer.data.error || 'the server answered ' + answer.status;
      document.getElementById('login-error').textContent = why;
      return;
    }
    start(answer.data);
  });
  document.getElementById('token').focus();
}

function start(who) {
  session = who;
  document.getElementById('nav').hidden = false;
  const badge = document.getElementById('who');
  badge.textContent = who.name + ' (' + who.allow.join(', ') + ')';
  badge.hidden = false;
  document.getElementById('logout').hidden = false;
  render();
}

async function boot() {
  document.getElementById('logout').addEventListener('click', async () => {
    await api('DELETE', '/console/session');
    session = null;
    login();
  });
  window.addEventListener('hashchange', () => { window.scrollTo(0, 0); render(); });
  document.addEventListener('visibilitychange', () => refresh(false));
  setInterval(() => refresh(false), REFRESH_MS);
  const answer = await api('GET', '/console/session');
  if (answer.status === 200) start(answer.data);
  else if (answer.status === 404) show(el('p', { class: 'notice' }, answer.data.error || 'the API is off'));
  else login();
}

document.addEventListener('DOMContentLoaded', boot);
